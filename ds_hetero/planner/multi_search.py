"""Plan a model with several encoders: every valid layout per encoder + language, predicted, ranked.

    result = plan_encoders(model, world_size, seq_len, rows, global_batch, machine, base=...)

`rows`: each encoder's boundary rows per sample ({"vision": 64, "audio": 50}); the language's
sequence (seq_len) includes them. The result is a search.Plan (`best`, `ds_config`), its
predictions ranked fitting first, then by tokens/s; `ranked_table_multi` prints every encoder's
layout and the Megatron baseline. Only configurations the engine runs are listed: enumerate_multi's
layouts (multi_candidate.py) and, with `modelled=True`, multi_extended.py's (a pipelined language,
first_stage, fewer encoder passes, recompute, per-stage ZeRO), each accepted by the engine's checks.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..families import adapter_for
from .encoders import MultiSpec, multi_spec
from .enumerate import SearchSpace
from .machine import MachineProfile
from .multi_candidate import enumerate_multi
from .multi_extended import extended_predictions
from .multi_predict import encoder_workloads, predict_multi
from .report import _gain, _gb, _time, breakdown_table
from .search import Plan, base_config, dtype_bytes, zero_stage
from .workload import Workload


def load_multi(model: Any):
    """(HF config, its MultiSpec or None, a model instance for the adapter or None) of `model`."""
    from .model_source import load_hf_config

    if hasattr(model, "config") and hasattr(model, "parameters"):
        return model.config, multi_spec(model.config), model
    cfg = load_hf_config(model)
    return cfg, multi_spec(cfg), None


def _meta_thinker(cfg):
    """The model on the meta device, for the adapter's checks (the thinker of an Omni config)."""
    import torch

    from .encoders import _thinker

    thinker = _thinker(cfg)
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    with torch.device("meta"):
        return Qwen2_5OmniThinkerForConditionalGeneration._from_config(thinker)


def check_rows(spec: MultiSpec, rows: Mapping[str, int], seq_len: int) -> dict[str, int]:
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


def plan_encoders(model: Any, world_size: int, seq_len: int, rows: Mapping[str, int], global_batch: int,
                  machine: MachineProfile, base: Mapping[str, Any] | None = None, memory_gb: float | None = None,
                  max_tp: int | None = None, placements: tuple[str, ...] = ("colocated", "disaggregated", "mixed"),
                  micro_batches: tuple[int, ...] | None = None, adapter=None,
                  has_client_optimizer: bool = False, modelled: bool = True) -> Plan:
    """`modelled`: also search multi_extended.py's candidates (the name `search.plan` uses; here
    every one listed runs: the engine's checks accepted it)."""
    hf_config, spec, instance = load_multi(model)
    if spec is None:
        raise ValueError("plan_encoders: this model has one encoder; use search.plan")
    adapter = adapter or adapter_for(instance if instance is not None else _meta_thinker(hf_config))
    rows = check_rows(spec, rows, seq_len)
    base = base_config(base, global_batch, None, machine.dtype_bytes == 2 and not base)
    wl = Workload(seq_len=seq_len, image_tokens=sum(rows.values()), global_batch=global_batch,
                  dtype_bytes=dtype_bytes(base), zero=zero_stage(base))
    wls = encoder_workloads(spec, wl, rows)
    max_tp = max_tp or min(world_size, machine.devices_per_node)
    space = SearchSpace(world_size=world_size, global_batch=global_batch, max_tp=max_tp, placements=placements,
                        micro_batches=micro_batches,
                        node_size=machine.devices_per_node if machine.devices_per_node < world_size else 0)
    candidates, stats = enumerate_multi(space, base, adapter, spec.names, has_client_optimizer)
    limit = memory_gb * 1e9 if memory_gb is not None else None
    cache: dict = {}
    preds = [predict_multi(c, spec, wls, wl, machine, limit, cache) for c in candidates]
    stats["pruned"] = 0
    if modelled:
        more, extra = extended_predictions(
            space, base, adapter, spec.names, spec.language.layers, wl.zero,
            lambda c: predict_multi(c, spec, wls, wl, machine, limit, cache), preds, stats["cp"],
            stats["sequence_parallel"], has_client_optimizer)
        preds += more
        for key in ("generated", "rejected", "pruned"):
            stats[key] += extra[key]
        for field, n in extra["reasons"].items():
            stats["reasons"][field] = stats["reasons"].get(field, 0) + n
    stats["runnable"], stats["modelled"], stats["extended"] = len(preds), 0, modelled
    stats["rows"] = rows
    preds.sort(key=lambda p: (not p.fits, -p.tokens_per_s))
    return Plan(preds, spec, wl, machine, base, stats)


def parse_rows(items, image_tokens: int | None) -> dict[str, int]:
    """`--rows STAGE=N` (repeated) and `--image-tokens` (the vision stage's rows) as {stage: rows}."""
    rows = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise ValueError(f"--rows {item!r}: give STAGE=N, e.g. --rows audio=50")
        rows[name.strip()] = int(value)
    if image_tokens is not None:
        rows.setdefault("vision", image_tokens)
    return rows


def plan_multi_from_args(args, base, machine) -> Plan | None:
    """The plan of `ds-hetero plan` for a model with several encoders; None for one encoder."""
    _, spec, _ = load_multi(args.model)
    if spec is None:
        if args.rows:
            raise ValueError("--rows is for models with several encoders; this one has one: use --image-tokens")
        return None
    if args.encoder_tokens is not None:
        raise ValueError("--encoder-tokens: give each encoder's boundary rows with --rows STAGE=N instead")
    placements = (args.placement,) if args.placement else ("colocated", "disaggregated", "mixed")
    return plan_encoders(args.model, args.world_size, args.seq_len, parse_rows(args.rows, args.image_tokens),
                         args.global_batch, machine, base=base, memory_gb=args.memory_gb, max_tp=args.max_tp,
                         placements=placements,
                         micro_batches=tuple(args.micro_batches) if args.micro_batches else None,
                         modelled=not args.no_modelled)


def ranked_table_multi(plan: Plan, top: int = 10) -> str:
    spec, wl, st = plan.spec, plan.workload, plan.stats
    encoders = ", ".join(f"{n} {e.params() / 1e6:.3g}M params ({e.kind}, {st['rows'][n]} rows per sample)"
                         for n, e in spec.encoders)
    lines = [
        f"model {spec.family}: {encoders}; language {spec.language.params() / 1e6:.3g}M params; seq {wl.seq_len}, "
        f"global batch {wl.global_batch}, ZeRO {wl.zero}, {wl.dtype_bytes}-byte dtype",
        f"machine {plan.machine.name}: {plan.machine.source}",
        f"{st['generated']} configurations generated, {st['runnable']} accepted by the engine's checks (cp > 1 "
        f"{'on' if st['cp'] else 'off'}, sequence parallelism {'on' if st['sequence_parallel'] else 'off'}; "
        f"language pipelines, first_stage, fewer encoder passes, recompute, per-stage ZeRO "
        f"{'on' if st.get('extended') else 'off'}), {st.get('pruned', 0)} with recompute or a per-stage ZeRO "
        "skipped (the same without it fits and runs)",
        "",
    ]
    head = (f"{'#':>3} {'placement':<13} {'layout (each encoder, L = language)':<60} {'step':>10} {'tokens/s':>10} "
            f"{'TFLOPS/dev':>10} {'peak GB/rank set':>16} {'boundary MB':>11} {'bubble':>6} {'fits':>4}")
    lines += [head, "-" * len(head)]
    for i, p in enumerate(plan.predictions[:top], 1):
        c = p.candidate
        lines.append(f"{i:>3} {c.placement:<13} {c.label():<60} {_time(p.step_s):>10} {p.tokens_per_s:>10.0f} "
                     f"{p.tflops_per_device:>10.3f} {'/'.join(_gb(v) for v in p.peak_memory.values()):>16} "
                     f"{p.boundary_bytes / 2**20:>11.2f} {100 * p.bubble:>5.0f}% {'yes' if p.fits else 'NO':>4}")
    lines.append("")
    best = plan.best if plan.predictions else None
    homog = plan.best_homogeneous()
    if best is not None:
        lines.append(f"pick: {best.candidate.label()} ({_time(best.step_s)})")
    if homog is not None:
        lines.append(f"baseline (every encoder in the language's layout): {homog.candidate.label()} "
                     f"({_time(homog.step_s)})")
    meg, meg_even = plan.best_megatron(), plan.best_megatron(even=True)
    if meg is not None:
        even = f"; with the even cut: {meg_even.candidate.label()} ({_time(meg_even.step_s)})" \
            if meg_even is not None and meg_even is not meg else ""
        lines.append(f"Megatron baseline, tuned (every encoder at the language's tp and dp on its first pipeline "
                     f"stage): {meg.candidate.label()} ({_time(meg.step_s)}){even}")
    gains = [f"{_gain(best, b)} vs {what}" for b, what in ((homog, "the baseline"), (meg, "the tuned Megatron baseline"))
             if b is not None]
    if best is not None and best.fits and gains:
        lines.append("pick: predicted tokens/s " + ", ".join(gains))
    return "\n".join(lines)


__all__ = ["breakdown_table", "check_rows", "load_multi", "plan_encoders", "ranked_table_multi"]
