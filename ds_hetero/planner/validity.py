"""Whether a candidate is a configuration ds_hetero accepts: the rules of `ds-hetero validate` and
`initialize` (config.py's parser, support.py's engine and model checks), called, never copied.

`check_candidate` is the one place the planner asks. It raises the HeteroConfigError
`initialize` would raise.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..config import SECTION, HeteroConfig, parse_config
from ..errors import HeteroConfigError
from .candidate import Candidate, StageChoice


def check_candidate(ds_config: Mapping[str, Any], world_size: int, adapter, has_client_optimizer: bool = False,
                    layout_cache: dict | None = None) -> HeteroConfig:
    """The validated config of `ds_config` for `world_size` ranks and the model behind `adapter`.

    With an adapter, the model-level checks `initialize` runs (`validation.check_model`: tp /
    cp sizes against the model's shapes, freeze, recompute layers, the pipeline's layer cut and
    tied embeddings) run on the adapter's model (a meta model will do).

    layout_cache   optional dict remembering the model checks' verdict per (stage, tp, cp, sequence
                   parallel, pp, ep, layer cut, recompute, freeze, ZeRO stage, offload): they read
                   nothing else of the config, and walking a large model's modules for each of
                   thousands of candidates would dominate planning
    """
    from ..validation import check_engine_support

    cfg = parse_config(ds_config, world_size)
    check_engine_support(cfg, has_client_optimizer)
    if adapter is None:
        return cfg
    if layout_cache is None:
        _model_checks(cfg, adapter)
        return cfg
    zero = cfg.ds_config.get("zero_optimization")
    offload = zero.get("offload_optimizer") if isinstance(zero, Mapping) else None
    key = (tuple((name, s.tp, s.cp, s.sequence_parallel, s.pp, s.ep, cfg.options_of(name).recompute,
                  cfg.options_of(name).freeze, cfg.zero_stage_of(name)) for name, s in cfg.stages.items()),
           cfg.pp_layers, repr(offload))  # ZeRO stage and offload: the tied-pipeline check reads them
    if key not in layout_cache:
        try:
            _model_checks(cfg, adapter)
            layout_cache[key] = None
        except HeteroConfigError as exc:
            layout_cache[key] = exc
    if layout_cache[key] is not None:
        raise layout_cache[key]
    return cfg


def _model_checks(cfg: HeteroConfig, adapter) -> None:
    """`check_model` on the adapter's model (the adapter's layout checks alone when it has none)."""
    from ..validation import check_model

    model = getattr(adapter, "model", None)
    if model is None:
        adapter.check_layouts(cfg)
    else:
        check_model(cfg, model)


def check_shapes(base: Mapping[str, Any], adapter, vision_tp: int, language_tp: int, language_cp: int,
                 sequence_parallel: bool, layout_cache: dict | None = None) -> None:
    """The model-shape part of the engine's checks for a candidate the engine's config cannot express
    yet (a pipeline, first_stage, recompute, per-stage ZeRO): the same tp / cp / sequence-parallel
    sizes in a colocated probe config on the smallest world both stages fill, through
    `check_candidate` (HeteroConfigError naming the field when the model's shapes refuse them)."""
    from math import lcm

    world = lcm(vision_tp, language_tp * language_cp)
    probe = Candidate("colocated", StageChoice(vision_tp, world // vision_tp),
                      StageChoice(language_tp, world // (language_tp * language_cp), language_cp, sequence_parallel), 1)
    cfg = dict(base, train_batch_size=world, zero_optimization={"stage": 1})
    check_candidate(probe.ds_config(cfg), world, adapter, True, layout_cache)


class StageShapes:
    """Whether the engine's checks accept a stage's sizes for the model's shapes (tp dividing heads,
    MLP width, vocabulary; cp and sequence parallelism): `check_candidate` on a colocated probe in
    which only that stage is sharded, remembered per stage and sizes. extended.py skips the
    layouts a probe refuses for several encoders (as modelled.py does with `check_shapes` for one); a
    refusal that names another field than the stage's own refuses nothing."""

    def __init__(self, base: Mapping[str, Any], adapter, names: tuple[str, ...]):
        self.base, self.adapter, self.names = base, adapter, names
        self.seen: dict = {}

    def encoder(self, name: str, tp: int) -> bool:
        encoders = tuple((n, StageChoice(tp, 1) if n == name else StageChoice(1, tp)) for n in self.names)
        return self._probe((name, tp), tp, Candidate("colocated", encoders, StageChoice(1, tp), 1))

    def language(self, tp: int, cp: int, sequence_parallel: bool) -> bool:
        n = tp * cp
        encoders = tuple((e, StageChoice(1, n)) for e in self.names)
        probe = Candidate("colocated", encoders, StageChoice(tp, 1, cp, sequence_parallel), 1)
        return self._probe(("language", tp, cp, sequence_parallel), n, probe)

    def _probe(self, key: tuple, world: int, probe: Candidate) -> bool:
        stage = key[0]
        if key not in self.seen:
            cfg = dict(self.base, train_batch_size=world, zero_optimization={"stage": 1})
            try:
                check_candidate(probe.ds_config(cfg), world, self.adapter, True)
                self.seen[key] = True
            except HeteroConfigError as exc:
                self.seen[key] = not exc.field.startswith(f"{SECTION}.stages.{stage}")
        return self.seen[key]
