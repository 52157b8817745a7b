"""Plan: enumerate every valid candidate, predict each, rank by tokens/s (fitting ones first).

    result = plan(model, world_size, seq_len, image_tokens, global_batch, machine, base=...)
    result = plan(omni, world_size, seq_len, None, global_batch, machine, rows={"vision": 64, "audio": 50})

A model with several encoders gives each encoder's boundary rows per sample (`rows`; the
language's sequence includes them; `image_tokens`, when given, is the vision stage's). Candidates
come from the enumeration (layouts without a pipeline, recompute or per-stage ZeRO, each checked
by the engine's checks) and, with `modelled=True`, the extended search (a language pipeline,
first_stage and the Megatron baseline, fewer encoder passes, recompute, per-stage ZeRO). For one
encoder the extended rows are runnable when the engine's checks accept their config and modelled
(priced only) when they refuse it; for several only accepted ones are listed. `Plan.best` is the
best runnable candidate (what `--write`, `auto` and `--trial` use); `best_overall` may be modelled only.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..config import SECTION
from ..config.batching import parse_language_batching, parse_packed_attention
from ..families import adapter_for
from .cost import Prediction
from .enumerate import SearchSpace, enumerate_candidates
from .extended import extended_one, extended_several
from .step_model import predict
from .frozen import kept_section, resolve_freeze
from .machine import MachineProfile
from .model_source import load_model
from .model_spec import model_spec
from ..models.shapes import ModelSpec
from .workload import ATTENTION_KERNELS, Workload, image_tokens_of

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


def torch_adam(cfg: Mapping[str, Any]) -> bool:
    """Whether the config's optimizer is torch's Adam / AdamW (`"torch_adam": true` in its params)."""
    opt = cfg.get("optimizer")
    params = opt.get("params") if isinstance(opt, Mapping) else None
    return (isinstance(params, Mapping) and params.get("torch_adam") is True
            and str(opt.get("type", "")).lower() in ("adam", "adamw"))


def dtype_bytes(cfg: Mapping[str, Any]) -> int:
    for key in ("bf16", "fp16"):
        section = cfg.get(key)
        if isinstance(section, Mapping) and section.get("enabled") is True:
            return 2
    return 4


def plan(model: Any, world_size: int, seq_len: int, image_tokens: int | None, global_batch: int,
         machine: MachineProfile, base: Mapping[str, Any] | None = None, memory_gb: float | None = None,
         max_tp: int | None = None, placements: tuple[str, ...] | None = None,
         micro_batches: tuple[int, ...] | None = None, adapter=None, has_client_optimizer: bool = False,
         modelled: bool = True, batch_slack: float = 0.0, encoder_tokens: int | None = None,
         rows: Mapping[str, int] | None = None, lengths: Sequence[int] | None = None,
         attention: str = "model") -> Plan:
    """Every valid configuration of `model` (an HF config, a path, a tiny name or a model), ranked.

    `adapter`: the model's stage adapter when the caller already holds the model (initialize);
    otherwise one is made from a model built on the meta device. One encoder: `image_tokens` (the
    language's) may be None when `encoder_tokens` (what the encoder sees) is given. Several: `rows`.
    `placements` (None: every one the model has: colocated, disaggregated, and mixed with several).
    `lengths`: language tokens of each sample of the batch (a length mix, language_mix.py), cut as
    the base config's `language_batching` says; None: every sample `seq_len` tokens.
    `attention`: how its packed rows are priced (ATTENTION_KERNELS): as the model's attention
    kernel runs them ("model": the adapter's `dense_rows` for the base config's `packed_attention`:
    per sample under sdpa and eager by default), as a varlen kernel, or dense.
    """
    if attention not in ATTENTION_KERNELS:
        raise ValueError(f"attention {attention!r}: one of {', '.join(ATTENTION_KERNELS)}")
    hf_config, instance = load_model(model, build=adapter is None)
    adapter = adapter or adapter_for(instance)
    spec = model_spec(hf_config)
    several = len(spec.encoders) > 1
    base = base_config(base, global_batch, None, machine.dtype_bytes == 2 and not base)
    wl = workload_of(spec, adapter, base, seq_len, image_tokens, global_batch, encoder_tokens, rows, lengths,
                     attention)
    max_tp = max_tp or min(world_size, machine.devices_per_node)
    default = ("colocated", "disaggregated", "mixed") if several else ("colocated", "disaggregated")
    space = SearchSpace(world_size=world_size, global_batch=global_batch, max_tp=max_tp,
                        placements=placements or default, micro_batches=micro_batches,
                        node_size=machine.devices_per_node if machine.devices_per_node < world_size else 0,
                        batch_slack=batch_slack, experts=spec.language.experts)
    limit = memory_gb * 1e9 if memory_gb is not None else None
    search = _search_several if several else _search_one
    preds, stats = search(space, spec, wl, machine, limit, base, adapter, has_client_optimizer, modelled)
    preds.sort(key=lambda p: (not p.fits, -p.tokens_per_s))
    return Plan(preds, spec, wl, machine, base, stats)


def workload_of(spec: ModelSpec, adapter, base: Mapping[str, Any], seq_len: int, image_tokens: int | None,
                global_batch: int, encoder_tokens: int | None = None, rows: Mapping[str, int] | None = None,
                lengths: Sequence[int] | None = None, attention: str = "model") -> Workload:
    """The workload `plan` and `--price` price: lengths, each encoder's rows, the base config's dtype, ZeRO
    stage, freeze and language batching (one place, so a priced layout and a planned one see the same)."""
    several = len(spec.encoders) > 1
    freeze = resolve_freeze(base.get(SECTION), adapter)
    batching, budget = parse_language_batching(base.get(SECTION) or {})
    choice = parse_packed_attention(base.get(SECTION) or {}, batching)
    dense = adapter.dense_rows(choice) if attention == "model" else attention == "dense"
    mix = {"lengths": tuple(int(n) for n in lengths or ()), "batching": batching, "budget": budget,
           "dense": dense, "torch_adam": torch_adam(base)}  # the rows the runtime cuts for that attention kernel
    if several:
        if encoder_tokens is not None:
            raise ValueError("--encoder-tokens: give each encoder's boundary rows with --rows STAGE=N instead")
        enc_rows = check_rows(spec, dict(rows or {}, **({"vision": image_tokens} if image_tokens is not None
                                                          and "vision" not in (rows or {}) else {})), seq_len)
        wl = Workload(seq_len=seq_len, image_tokens=sum(enc_rows.values()), global_batch=global_batch,
                      dtype_bytes=dtype_bytes(base), zero=zero_stage(base), freeze=freeze,
                      rows=tuple(enc_rows.items()), **mix)
        wl.check_lengths()
        return wl
    if rows:
        raise ValueError("--rows is for models with several encoders; this one has one: use --image-tokens")
    wl = Workload(seq_len=seq_len, image_tokens=image_tokens_of(spec, image_tokens, encoder_tokens),
                  global_batch=global_batch, dtype_bytes=dtype_bytes(base), zero=zero_stage(base), freeze=freeze,
                  **mix)
    wl.check(spec)
    return wl


def _search_one(space, spec, wl, machine, limit, base, adapter, client_opt, modelled):
    """(predictions, stats) of a model with one encoder."""
    candidates, stats = enumerate_candidates(space, base, adapter, client_opt)
    cache: dict = {}
    preds = [predict(c, spec, wl, machine, limit, cache=cache) for c in candidates]
    stats["runnable"], stats["pruned"] = len(preds), 0
    if modelled:
        extended = extended_one(spec, wl, machine, limit, base, adapter, space, cache, client_opt, preds, stats)
        preds += extended
        stats["runnable"] += sum(p.runnable for p in extended)
        stats["generated"] += len(extended) + stats["pruned"]  # every candidate considered is counted once
    stats["modelled"] = len(preds) - stats["runnable"]
    return preds, stats


def _search_several(space, spec, wl, machine, limit, base, adapter, client_opt, modelled):
    """(predictions, stats) of a model with several encoders: only what the engine's checks accept."""
    candidates, stats = enumerate_candidates(space, base, adapter, client_opt, spec.names)
    cache: dict = {}
    preds = [predict(c, spec, wl, machine, limit, cache=cache) for c in candidates]
    stats["pruned"] = 0
    if modelled:
        more, extra = extended_several(
            space, base, adapter, spec.names, spec.language.layers, wl.zero,
            lambda c: predict(c, spec, wl, machine, limit, cache=cache), preds, stats["cp"],
            stats["sequence_parallel"], client_opt)
        preds += more
        for key in ("generated", "rejected", "pruned"):
            stats[key] += extra[key]
        stats["generated"] += extra["pruned"]  # skipped before extended_several counts them: counted once here
        for field, n in extra["reasons"].items():
            stats["reasons"][field] = stats["reasons"].get(field, 0) + n
    stats["runnable"], stats["modelled"], stats["extended"] = len(preds), 0, modelled
    stats["rows"] = dict(wl.rows)
    return preds, stats


def check_rows(spec: ModelSpec, rows: Mapping[str, int], seq_len: int) -> dict[str, int]:
    """Every encoder's rows per sample, given, non-negative, fitting in the sequence together."""
    missing = [n for n in spec.names if n not in rows]
    if missing:
        raise ValueError(f"give each encoder's boundary rows per sample: --rows {' '.join(f'{n}=N' for n in missing)}"
                         f" (this model's encoders: {', '.join(spec.names)})")
    unknown = [n for n in rows if n not in spec.names]
    if unknown:
        raise ValueError(f"--rows {unknown[0]}: not an encoder of this model ({', '.join(spec.names)})")
    if any(int(v) < 0 for v in rows.values()):
        raise ValueError("--rows: rows per sample must be >= 0")
    if sum(rows.values()) > seq_len:
        raise ValueError(f"the encoders' rows per sample ({sum(rows.values())}: "
                         f"{', '.join(f'{n} {rows[n]}' for n in spec.names)}) exceed --seq-len {seq_len}")
    return {n: int(rows[n]) for n in spec.names}


def write_config(path: str | os.PathLike, cfg: Mapping[str, Any]) -> None:
    import json

    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
