"""What a Trainer subclass's loss does, checked against what the engine computes; the optimizer it built.

The engine computes the loss itself (token cross-entropy over the global batch, divided by the
global label count: the Trainer's and TRL's default "nll" loss) in each stage's layout, so
`compute_loss` never runs. Whatever a subclass's loss would change is therefore refused here, by
name, at construction and on every rank, never silently dropped:

    compute_loss_func, label_smoothing_factor, TRL loss_type other than "nll" (e.g. "dft"), MoE
    auxiliary losses (TRL's aux_loss_enabled) of a family whose language stage does not add one
    (Qwen3-VL-MoE's does, with TRL's coefficient: docs/expert-parallel.md), padding-free / packed batches, a PEFT method other than
    LoRA (LoRA layouts are checked by tensor_parallel/lora_checks.py), and a
    `compute_loss` override ds_hetero does not know (declare it loss-neutral with
    `ds_hetero.hetero(MyTrainer, engine_loss=True)`)

What TRL's `compute_loss` reports besides the loss (mean_token_accuracy, entropy, num_tokens) comes
from the engine's loss pass (token_metrics.py) and the prepared batch.

`per_stage_optimizer`: an optimizer a subclass's `create_optimizer` built over the whole model
(LLaMA-Factory's custom optimizers, per-group learning rates) rebuilt for each stage: the same
class and hyperparameters, each stage's parameters in the group their name had.
"""

from __future__ import annotations

from typing import Callable

import torch

from ...errors import HeteroConfigError

# compute_loss implementations whose loss the engine reproduces exactly (with the options above refused)
KNOWN_LOSSES = {"transformers.trainer.Trainer", "trl.trainer.sft_trainer.SFTTrainer"}
ONE_LINE = "ds_hetero.hetero(YourTrainer)(...)"


def _qualname(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def defining_class(trainer, method: str):
    """The first class in the trainer's MRO (past the ds_hetero mixin) that defines `method`."""
    for cls in type(trainer).__mro__:
        if method in vars(cls) and not vars(cls).get("_ds_hetero_mixin", False):
            return cls
    return None


def _engine_adds_aux_loss(model) -> bool:
    """Whether the engine's loss pass adds the model's router load-balancing loss (TRL set
    `output_router_logits` and `router_aux_loss_coef` on its config: expert_parallel/aux_loss.py)."""
    from ...families import adapter_for

    base = getattr(model, "get_base_model", lambda: model)()  # a PEFT model: its base
    try:
        return bool(adapter_for(base).has_aux_loss)
    except TypeError:  # no adapter: refused elsewhere, by name
        return False


def loss_problems(trainer) -> list[str]:
    args = trainer.args
    problems = []
    if getattr(trainer, "compute_loss_func", None) is not None:
        problems.append("compute_loss_func: ds_hetero computes the loss inside its engine (token cross-entropy over "
                        "the global batch) and cannot call a custom loss function; remove compute_loss_func")
    if getattr(args, "label_smoothing_factor", 0):
        problems.append(f"label_smoothing_factor={args.label_smoothing_factor}: the engine's loss has no label "
                        f"smoothing; set it to 0")
    loss_type = getattr(args, "loss_type", None)
    if loss_type not in (None, "nll"):
        problems.append(f'loss_type="{loss_type}": the engine computes the "nll" loss only; set loss_type="nll"')
    for flag in ("enable_dft_loss", "enable_channel_loss"):  # ms-swift's loss variants
        if getattr(args, flag, False):
            problems.append(f"{flag}=True: the engine computes the plain token cross-entropy; set {flag}=False")
    if getattr(trainer, "aux_loss_enabled", False) and not _engine_adds_aux_loss(getattr(trainer, "model", None)):
        problems.append("an MoE auxiliary loss (router_aux_loss_coef / output_router_logits) is enabled, but the "
                        "engine adds one only for the mixture-of-experts families it knows (Qwen3-VL-MoE); "
                        "disable it")
    if getattr(args, "padding_free", False) or getattr(args, "packing", False):
        problems.append("padding_free / packing: the engine batches each stage's share itself; set padding_free=False "
                        "and packing=False, and for packed rows set hetero_parallel.language_batching to \"packed\" "
                        "(docs/packing.md)")
    model = getattr(trainer, "model", None)
    peft_type = getattr(getattr(model, "peft_config", {}).get("default"), "peft_type", None) \
        if type(model).__name__.startswith("Peft") else None
    if peft_type is not None and str(getattr(peft_type, "value", peft_type)) != "LORA":
        problems.append(f"the model is a PEFT {peft_type} model: ds_hetero trains LoRA adapters only")
    cls = defining_class(trainer, "compute_loss")
    if cls is not None and _qualname(cls) not in KNOWN_LOSSES and not getattr(trainer, "hetero_engine_loss", False):
        problems.append(
            f"{_qualname(cls)}.compute_loss overrides the loss, but the engine computes the loss itself and never "
            f"calls compute_loss. If the override computes the standard token cross-entropy (it only logs, or "
            f"passes through to super()), declare it with `ds_hetero.hetero({cls.__name__}, engine_loss=True)`; "
            f"otherwise it cannot be trained with ds_hetero")
    return problems


def check_loss_options(trainer) -> None:
    problems = loss_problems(trainer)
    if problems:
        raise HeteroConfigError(
            "Trainer", f"{type(trainer).__name__}: options that change the loss cannot run inside the ds_hetero "
            "engine:\n  - " + "\n  - ".join(problems))


def overrides(trainer, method: str) -> bool:
    """True when a class other than transformers.Trainer (and ds_hetero's mixin) defines `method`."""
    cls = defining_class(trainer, method)
    return cls is not None and _qualname(cls) != "transformers.trainer.Trainer"


def per_stage_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module
                        ) -> Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]:
    """A factory `stage params -> optimizer` reproducing `optimizer`'s class and param groups per stage.

    Groups are matched by parameter name: tensor parallelism replaces a sharded layer's
    parameters, but keeps their names (the factory runs after sharding, names looked up then).
    """
    index = {id(p): gi for gi, g in enumerate(optimizer.param_groups) for p in g["params"]}
    group_of = {name: index[id(p)] for name, p in model.named_parameters() if id(p) in index}
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    cls, defaults = type(optimizer), dict(optimizer.defaults)

    def factory(params: list) -> torch.optim.Optimizer:
        """`params`: parameters, or ds_hetero's own groups of them (a stage's, an expert group's:
        each split again by the user's groups, its own keys kept)."""
        names = {id(p): n for n, p in model.named_parameters()}
        params = list(params)
        outer_groups = params if params and all(isinstance(g, dict) for g in params) else [{"params": params}]
        built = []
        for outer in outer_groups:
            groups: list[list[torch.nn.Parameter]] = [[] for _ in hyper]
            for p in outer["params"]:
                name = names.get(id(p))
                if name not in group_of:
                    raise HeteroConfigError(
                        "create_optimizer", f"parameter {name or '<unnamed>'} is trained by ds_hetero but is in no "
                        f"param group of the optimizer create_optimizer built ({cls.__name__}); put every trainable "
                        f"parameter in a group")
                groups[group_of[name]].append(p)
            keys = {k: v for k, v in outer.items() if k != "params"}
            built += [{**hyper[i], **keys, "params": ps} for i, ps in enumerate(groups) if ps]
        try:
            return cls(built, **defaults)
        except TypeError:  # an optimizer whose defaults are not all constructor arguments
            return cls(built)

    return factory
