"""Plan: enumerate every valid candidate, predict each, rank by tokens/s (fitting ones first).

Candidates come from enumerate.py (layouts without a pipeline, recompute or per-stage ZeRO, each
checked by the engine's checks) and, with `modelled=True`, from modelled.py (a language pipeline,
first_stage and the Megatron baseline, recompute, per-stage ZeRO), each runnable when the engine's
checks accept its config and modelled (priced only) when they refuse it. `Plan.best` is the best
runnable candidate (what `--write`, `auto` and `--trial` use); `best_overall` may be modelled only.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any, Mapping

from ..config import SECTION
from ..families import adapter_for
from .cost import Prediction
from .enumerate import SearchSpace, enumerate_candidates
from .modelled import (ModelledSpace, disaggregated_candidates, heterogeneous_candidates, megatron_candidates,
                       tune_cut)
from .step_model import predict
from .verdicts import EngineVerdicts
from .dominance import Dominance
from .frozen import kept_section, resolve_freeze
from .machine import MachineProfile
from .model_source import load_hf_config, meta_model
from .model_spec import ModelSpec, model_spec
from .workload import Workload, image_tokens_of

DEFAULT_OPTIMIZER = {"type": "AdamW", "params": {"lr": 1e-4}}


@dataclass(frozen=True)
class Plan:
    predictions: list[Prediction]  # best first: fitting ones by step time, then the others
    spec: ModelSpec
    workload: Workload
    machine: MachineProfile
    base: Mapping[str, Any]
    stats: Mapping[str, Any]

    @property
    def runnable(self) -> list[Prediction]:
        return [p for p in self.predictions if p.runnable]

    @property
    def best(self) -> Prediction:
        """The best candidate the engine runs today (fitting first)."""
        return self.runnable[0]

    @property
    def best_overall(self) -> Prediction:
        return self.predictions[0]

    def best_where(self, pred) -> Prediction | None:
        return next((p for p in self.predictions if p.fits and pred(p.candidate)), None)

    def best_homogeneous(self) -> Prediction | None:
        """Today's single layout: colocated, vision in the language's tp x (cp dp) split as plain dp."""
        return self.best_where(lambda c: c.homogeneous and not c.modelled_features)

    def best_megatron(self, even: bool = False) -> Prediction | None:
        """The tuned Megatron baseline (first_stage), or its best with the even cut."""
        return self.best_where(lambda c: c.megatron and (not even or c.pp_layers is None))


    def ds_config(self, prediction: Prediction | None = None, extra_section: Mapping[str, Any] | None = None
                  ) -> dict[str, Any]:
        return (prediction or self.best).candidate.ds_config(self.base, extra_section)


def base_config(base: Mapping[str, Any] | None, global_batch: int, zero: int | None, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed config every candidate shares (the user's, or ZeRO 1 + AdamW). Of the user's
    hetero_parallel section only each stage's `freeze` is kept: it decides what trains, not how
    fast, so every candidate carries it (Candidate.ds_config) and the cost model prices it."""
    cfg = copy.deepcopy(dict(base or {}))
    kept = kept_section(cfg.pop(SECTION, None))
    if kept:
        cfg[SECTION] = kept
    cfg["train_batch_size"] = global_batch
    if zero is not None:
        cfg.setdefault("zero_optimization", {})
        cfg["zero_optimization"] = dict(cfg["zero_optimization"], stage=zero)
    cfg.setdefault("zero_optimization", {"stage": 1})
    cfg.setdefault("optimizer", copy.deepcopy(DEFAULT_OPTIMIZER))
    if bf16:
        cfg.setdefault("bf16", {"enabled": True})
    return cfg


def zero_stage(cfg: Mapping[str, Any]) -> int:
    z = cfg.get("zero_optimization")
    return int(z.get("stage", 0)) if isinstance(z, Mapping) else 0


def dtype_bytes(cfg: Mapping[str, Any]) -> int:
    for key in ("bf16", "fp16"):
        section = cfg.get(key)
        if isinstance(section, Mapping) and section.get("enabled") is True:
            return 2
    return 4


def plan(model: Any, world_size: int, seq_len: int, image_tokens: int, global_batch: int,
         machine: MachineProfile, base: Mapping[str, Any] | None = None, memory_gb: float | None = None,
         max_tp: int | None = None, placements: tuple[str, ...] = ("colocated", "disaggregated"),
         micro_batches: tuple[int, ...] | None = None, adapter=None, has_client_optimizer: bool = False,
         modelled: bool = True, batch_slack: float = 0.0, encoder_tokens: int | None = None) -> Plan:
    """Every valid configuration of `model` (an HF config, a path, a tiny name or a model), ranked.

    `adapter`: the model's stage adapter when the caller already holds the model (initialize);
    otherwise one is made from a model built on the meta device. `image_tokens` (the language's)
    may be None when `encoder_tokens` (what the encoder sees) is given.
    """
    if hasattr(model, "config") and hasattr(model, "parameters"):  # a model instance
        hf_config = model.config
        adapter = adapter or adapter_for(model)
    else:
        hf_config = load_hf_config(model)
        adapter = adapter or adapter_for(meta_model(hf_config))
    spec = model_spec(hf_config)
    image_tokens = image_tokens_of(spec, image_tokens, encoder_tokens)
    base = base_config(base, global_batch, None, machine.dtype_bytes == 2 and not base)
    wl = Workload(seq_len=seq_len, image_tokens=image_tokens, global_batch=global_batch,
                  dtype_bytes=dtype_bytes(base), zero=zero_stage(base), freeze=resolve_freeze(base.get(SECTION), adapter))
    wl.check(spec)
    max_tp = max_tp or min(world_size, machine.devices_per_node)
    space = SearchSpace(world_size=world_size, global_batch=global_batch, max_tp=max_tp,
                        placements=placements, micro_batches=micro_batches,
                        node_size=machine.devices_per_node if machine.devices_per_node < world_size else 0,
                        batch_slack=batch_slack)
    candidates, stats = enumerate_candidates(space, base, adapter, has_client_optimizer)
    limit = memory_gb * 1e9 if memory_gb is not None else None
    cache: dict = {}
    preds = [predict(c, spec, wl, machine, limit, cache=cache) for c in candidates]
    stats["runnable"] = len(preds)
    if modelled:
        extended = _modelled(spec, wl, machine, limit, base, adapter, max_tp, micro_batches, world_size,
                             placements, cache, has_client_optimizer, preds)
        preds += extended
        stats["runnable"] += sum(p.runnable for p in extended)
    stats["modelled"] = len(preds) - stats["runnable"]
    preds.sort(key=lambda p: (not p.fits, -p.tokens_per_s))
    return Plan(preds, spec, wl, machine, base, stats)


def _modelled(spec, wl, machine, limit, base, adapter, max_tp, micro_batches, world, placements, times: dict,
              client_opt: bool = False, runnable: list[Prediction] = ()) -> list[Prediction]:
    """Megatron's single layouts (with their cut tuned) and heterogeneous candidates with a pipeline,
    first_stage, recompute or per-stage ZeRO; each runnable when the engine's checks accept its config."""
    ms = ModelledSpace(world, wl.global_batch, spec.language.layers, max_tp, wl.zero, micro_batches)
    cache: dict = {}
    verdicts = EngineVerdicts(base, world, adapter, client_opt)
    dominance = Dominance()
    for pred in runnable:
        dominance.record(pred)

    def priced(cands):
        out = []
        for c in cands:  # generated with each feature off before on, so the lighter siblings come first
            if dominance.dominated(c):
                continue
            pred = predict(c, spec, wl, machine, limit, runnable=verdicts.accepts(c), cache=times)
            dominance.record(pred)
            out.append(pred)
        return out

    meg = priced(megatron_candidates(ms, base, adapter, cache))
    meg.sort(key=lambda p: (not p.fits, -p.tokens_per_s))
    tuned = []
    for p in meg[:TUNE_TOP]:  # tune the first stage's layers of the best few even-cut layouts
        tuned += priced(tune_cut(p.candidate, spec.language.layers))
    out = meg + tuned
    if "colocated" in placements:
        out += priced(heterogeneous_candidates(ms, base, adapter, cache))
    if "disaggregated" in placements:
        node = machine.devices_per_node if machine.devices_per_node < world else 0
        out += priced(disaggregated_candidates(ms, base, adapter, cache, node))
    return out


TUNE_TOP = 8


def write_config(path: str | os.PathLike, cfg: Mapping[str, Any]) -> None:
    import json

    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
