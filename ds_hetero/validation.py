"""What HeteroEngine runs today: the one set of checks `ds-hetero validate` and `initialize` share.

`load_config` (config.py) checks that a config is well formed for a world size; the checks here
refuse well-formed configs the engine cannot run (yet), and, given the model, the layouts the
model's shapes do not allow. Both are pure (config, world size, model config): every rank
raises the same HeteroConfigError before any collective, and `ds-hetero validate` says exactly
what `initialize` will say.
"""

from __future__ import annotations

from typing import Mapping

from .config import HeteroConfig
from .errors import HeteroConfigError


def check_engine_support(cfg: HeteroConfig, has_client_optimizer: bool = False) -> None:
    """Refuse what the engine cannot run; `has_client_optimizer`: `initialize(optimizer=...)`."""
    ds = cfg.ds_config
    bf16 = ds.get("bf16")
    for name in cfg.stages:
        zero, field = cfg.zero_stage_of(name), _zero_field(cfg, name)
        if isinstance(bf16, Mapping) and bf16.get("enabled") is True and zero == 0 and not cfg.options_of(name).frozen:
            raise HeteroConfigError(
                field, f"stage {name!r}: bf16 with ZeRO stage 0 makes DeepSpeed wrap the optimizer in its "
                "BF16_Optimizer, whose clipping cannot span all stages; use ZeRO stage 1, 2 or 3 with bf16")
        if cfg.placement in ("disaggregated", "mixed") and zero == 3:
            raise HeteroConfigError(
                field, f"stage {name!r}: ZeRO stage 3 is not supported with placement {cfg.placement!r}: "
                "DeepSpeed's ZeRO-3 parameter trace check broadcasts over the world group from inside each stage's "
                "forward, which the other stage never joins; use stage 1 or 2 (or placement \"colocated\")")
        encoder = name != cfg.language.name and not cfg.options_of(name).frozen
        if cfg.placement == "first_stage" and zero == 3 and encoder:
            raise HeteroConfigError(
                field, f"stage {name!r}: ZeRO stage 3 is not supported on an encoder in placement \"first_stage\": "
                "the encoder runs on the first pipeline stage's ranks only, and DeepSpeed's ZeRO-3 optimizer calls a "
                "barrier over the world group while it is built (stage3.py, partitioning its parameters), which the "
                "other ranks never join; give the encoder \"zero_stage\": 1 or 2 (the language stage may keep 3)")
    check_stage_options(cfg)
    from .config import ENCODER_STAGES as known  # the families' names, without importing them (torch)

    extra = [name for name in cfg.stages if name != cfg.language.name and name not in known]
    if extra:  # with the model, its adapter checks its own stages (check_model)
        raise HeteroConfigError(
            f"hetero_parallel.stages.{extra[0]}",
            f"no model adapter has an {extra[0]!r} encoder stage yet (they have {', '.join(known)}); remove it")
    check_sequence_shards(cfg, cfg.zero_stage_of(cfg.language.name))
    check_language_batching(cfg)
    if "optimizer" not in ds and not has_client_optimizer:
        raise HeteroConfigError(
            "optimizer", 'missing; every stage engine builds its optimizer from it, e.g. '
            '{"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": true}} (or pass '
            "initialize(..., optimizer=callable); `ds-hetero validate --client-optimizer` checks that case)")
    fp16 = ds.get("fp16", {})
    if isinstance(fp16, Mapping) and fp16.get("enabled") is True:
        raise HeteroConfigError("fp16.enabled", "fp16 loss scaling across stages is not supported; use bf16")


def _zero_field(cfg: HeteroConfig, stage: str) -> str:
    """The field that sets `stage`'s ZeRO stage (for the error message)."""
    if cfg.options_of(stage).zero_stage is not None:
        return f"hetero_parallel.stages.{stage}.zero_stage"
    return "zero_optimization.stage"


def check_stage_options(cfg: HeteroConfig) -> None:
    """`recompute`, `zero_stage`, `freeze` together (each alone is checked by config/stage_options.py)."""
    if all(cfg.options_of(name).frozen for name in cfg.stages):
        raise HeteroConfigError(
            f"hetero_parallel.stages.{cfg.language.name}.freeze",
            "every stage is frozen: nothing would train; unfreeze at least one stage (or use eval_batch)")
    for name in cfg.stages:
        options = cfg.options_of(name)
        if options.frozen and options.zero_stage is not None:
            raise HeteroConfigError(
                f"hetero_parallel.stages.{name}.zero_stage",
                f"stage {name!r} is frozen (freeze: true): it has no optimizer state to partition and runs without "
                "ZeRO; remove zero_stage (or the freeze)")
        if options.frozen and options.recompute:
            raise HeteroConfigError(
                f"hetero_parallel.stages.{name}.recompute",
                f"stage {name!r} is frozen (freeze: true): recompute is not supported on a frozen stage (a "
                "frozen encoder keeps no activation; a frozen language stage keeps only what the rows' gradient "
                "needs); remove recompute")


def check_sequence_shards(cfg: HeteroConfig, zero: int) -> None:
    """ZeRO 3 on a context-parallel language stage needs DeepSpeed's reduce-scatter path, the one
    context_parallel/zero3.py corrects."""
    section = cfg.ds_config.get("zero_optimization")
    reduce_scatter = section.get("reduce_scatter", True) if isinstance(section, Mapping) else True
    if zero == 3 and cfg.language.cp > 1 and reduce_scatter is False:
        raise HeteroConfigError(
            "zero_optimization.reduce_scatter",
            "false with ZeRO stage 3 on a context-parallel language stage: DeepSpeed 0.19's ZeRO-3 averages the cp "
            "shards' gradients over dp x cp on its reduce-scatter path, which ds_hetero corrects, and its other paths "
            "differ; remove the key (default true)")


def check_language_batching(cfg: HeteroConfig) -> None:
    """Packed language micro-batches (step/packing.py) run with tp, sequence parallelism, cp, pp,
    every ZeRO stage and every placement; what a model family cannot pack its check_model says."""
    return


def check_pipeline_model(cfg: HeteroConfig, model) -> None:
    """The layer cut fits the decoder, and no weight is shared between the first and last chunk."""
    from .pipeline_parallel.cut import layer_cut

    if cfg.language.pp == 1:
        return
    text = getattr(model.config, "text_config", model.config)
    layer_cut(text.num_hidden_layers, cfg.language.pp, cfg.pp_layers)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is not None and embed is not None and head.weight is embed.weight:
        check_tied_pipeline(cfg)


def check_tied_pipeline(cfg: HeteroConfig) -> None:
    """Tied embeddings with pp > 1 keep a copy on the first and the last pipeline stage and sum
    their gradients where ZeRO 0-2 hold them on the device (stages/tied_embeddings.py)."""
    zero = cfg.zero_stage_of(cfg.language.name)
    if zero == 3:
        raise HeteroConfigError(
            _zero_field(cfg, cfg.language.name), "ZeRO stage 3 with tied input/output embeddings and a pipelined "
            "language stage (pp > 1) is not supported: the two copies' gradients are summed in ZeRO 0-2's buffers; "
            "use ZeRO stage 0, 1 or 2, or pp 1")
    section = cfg.ds_config.get("zero_optimization")
    offload = section.get("offload_optimizer") if isinstance(section, Mapping) else None
    if isinstance(offload, Mapping) and offload.get("device", "none") not in (None, "none"):
        raise HeteroConfigError(
            "zero_optimization.offload_optimizer", "optimizer offload with tied input/output embeddings and a "
            "pipelined language stage (pp > 1) is not supported: the two copies' gradients are summed on the "
            "device; remove offload_optimizer, or use pp 1")


def check_model(cfg: HeteroConfig, model, adapter=None) -> None:
    """The model-level checks: an adapter exists, every tp divides what it must (heads, kv
    heads, MLP width, vocabulary), every freeze entry names parameters and something trains.
    Needs only shapes and requires_grad flags: a model on the meta device will do. `adapter`: the
    one `initialize` was given (default: the family registry's for the model)."""
    from .families import adapter_for
    from .models.freeze import check_freeze
    from .models.recompute import check_recompute

    if adapter is None:
        try:
            adapter = adapter_for(model)
        except TypeError as exc:
            raise HeteroConfigError("model", str(exc)) from None
    adapter.check_layouts(cfg)
    if cfg.packed and adapter.PACKING_REFUSED:
        raise HeteroConfigError("hetero_parallel.language_batching",
                                f"\"packed\" is not supported for {type(model).__name__}: {adapter.PACKING_REFUSED}; "
                                "use \"samples\"")
    if cfg.packed:
        adapter.packed_attention(cfg.packed_attention)  # a choice the decoder cannot take raises by name
    check_freeze(cfg, adapter)
    check_recompute(cfg, adapter)
    check_pipeline_model(cfg, model)


def check_all(cfg: HeteroConfig, model=None, has_client_optimizer: bool = False, adapter=None) -> None:
    """Everything `initialize` checks before its first collective (the model's checks if given)."""
    check_engine_support(cfg, has_client_optimizer)
    if model is not None:
        check_model(cfg, model, adapter)
