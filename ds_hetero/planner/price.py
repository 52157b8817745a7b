"""`ds-hetero plan --price CONFIG.json`: the cost model on exactly one given layout, no search.

Why: the search answers "which layout"; a user who already has a layout (their own, Megatron's, a
published run's) wants its predicted figures, with the same model and validation as the search, to
hold against a measured run.

The layout is the config's `hetero_parallel` section, checked first as `ds-hetero validate CONFIG
--model M` checks it (config/parse.py, validation.py's engine and model checks: an invalid config
is refused with validate's error). It becomes the planner's `Candidate` (placement, every stage's
tp / cp / dp / pp / ep / sp / ranks, recompute, per-stage ZeRO, micro-batches, encoder passes, the
pipeline's cut) and is priced by `step_model.predict` on the workload `plan` would price.

FLOPs: both scopes are planner/flops.py's formulas on the whole batch (`step_model.model_flops`:
every encoder plus the language; `language_work` alone), the same formulas the runtime's
`ds_hetero.throughput.StepFlops` sums per step. TFLOP/s per GPU divide by every GPU of the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..config import ENCODER_STAGES, SECTION, HeteroConfig, parse_config
from .candidate import Candidate, StageChoice
from .cost import Prediction


@dataclass(frozen=True)
class Priced:
    """One layout's prediction and the figures `--price` reports."""

    prediction: Prediction
    world_size: int
    model_flops: float  # per step, whole model (every encoder + language)
    language_flops: float  # per step, the language model alone
    real_tokens: int  # language tokens per step that are not padding

    @property
    def step_s(self) -> float:
        return self.prediction.step_s

    def tflops_per_gpu(self, scope: str = "model") -> float:
        flops = self.model_flops if scope == "model" else self.language_flops
        return flops / self.step_s / self.world_size / 1e12

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.real_tokens / self.step_s / self.world_size

    def as_dict(self) -> dict[str, Any]:
        p = self.prediction
        return {
            "layout": p.candidate.label(), "world_size": self.world_size, "step_s": p.step_s,
            "tflops_per_gpu": {"model": self.tflops_per_gpu("model"), "language": self.tflops_per_gpu("language")},
            "flops_per_step": {"model": self.model_flops, "language": self.language_flops},
            "flops_formula": "planner/flops.py (the runtime's StepFlops): 2mkn per GEMM, forward + backward",
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "tokens_per_step": self.real_tokens,
            "memory_gb_per_rank": {k: v / 1e9 for k, v in p.peak_memory.items()}, "fits": p.fits,
            "boundary_bytes": p.boundary_bytes, "bubble": p.bubble,
            "breakdown_s": {stage: dict(parts) for stage, parts in p.breakdown.items()},
        }


def stage_choice(cfg: HeteroConfig, name: str, apart: bool) -> StageChoice:
    """One stage of the validated config as the cost model's StageChoice (ranks kept when apart)."""
    layout, options = cfg.stages[name], cfg.options_of(name)
    return StageChoice(layout.tp, layout.dp, layout.cp, layout.sequence_parallel,
                       tuple(layout.ranks) if apart else (), layout.pp, bool(options.recompute),
                       options.zero_stage, layout.ep)


def candidate_of(cfg: HeteroConfig) -> Candidate:
    """The validated config as the planner's Candidate. Recompute of the first N layers only is priced
    as every layer's (the cost model's recompute is all or nothing)."""
    language = cfg.language
    names = [layout.name for layout in cfg.encoders]
    apart = {n: not set(cfg.stages[n].ranks) & set(language.ranks) for n in names}
    placement = cfg.placement
    if placement not in ("colocated", "disaggregated", "first_stage"):
        placement = "mixed"
    elif placement == "colocated" and any(apart.values()):
        placement = "mixed"
    disagg = placement in ("disaggregated", "mixed")
    encoders = tuple((n, stage_choice(cfg, n, disagg and apart[n])) for n in names)
    passes = tuple((n, cfg.micro_batches_of(n)) for n in names if cfg.micro_batches_of(n) != cfg.micro_batches)
    return Candidate(placement, encoders, stage_choice(cfg, language.name, disagg), cfg.micro_batches, passes,
                     cfg.pp_layers)  # the workload carries the config's global batch


def validated(ds_config: Mapping[str, Any], world_size: int, adapter, has_client_optimizer: bool = False
              ) -> HeteroConfig:
    """validate's checks (the ones `ds-hetero validate CONFIG --model M` runs), or its HeteroConfigError."""
    from ..validation import check_engine_support
    from .validity import _model_checks

    cfg = parse_config(ds_config, world_size, ENCODER_STAGES)
    check_engine_support(cfg, has_client_optimizer)
    _model_checks(cfg, adapter)
    return cfg


def price(model: Any, ds_config: Mapping[str, Any], world_size: int, seq_len: int, machine,
          image_tokens: int | None = None, encoder_tokens: int | None = None, rows: Mapping[str, int] | None = None,
          lengths=None, attention: str = "model", memory_gb: float | None = None,
          has_client_optimizer: bool = False) -> Priced:
    """The prediction of the layout in `ds_config` for `model` (an HF config, a path or a tiny name)."""
    from ..families import adapter_for
    from .flops import language_work
    from .language_mix import whole_batch
    from .model_source import load_model
    from .model_spec import model_spec
    from .search import workload_of
    from .step_model import model_flops, predict

    if not isinstance(ds_config.get(SECTION), Mapping) or ds_config[SECTION].get("auto") is True:
        raise ValueError(f"--price: the config needs a {SECTION} section with its layouts (not \"auto\")")
    hf_config, instance = load_model(model)
    adapter = adapter_for(instance)
    cfg = validated(ds_config, world_size, adapter, has_client_optimizer)
    spec = model_spec(hf_config)
    wl = workload_of(spec, adapter, ds_config, seq_len, image_tokens, cfg.global_batch_size, encoder_tokens, rows,
                     lengths, attention)
    pred = predict(candidate_of(cfg), spec, wl, machine, memory_gb * 1e9 if memory_gb is not None else None)
    samples, lwl = whole_batch(wl) if wl.lengths else (wl.global_batch, wl)
    language = language_work(spec.view(spec.names[0]), lwl, samples, 1, 1, machine.causal).flops
    return Priced(pred, world_size, model_flops(spec, wl, machine.causal), language, wl.real_tokens())


def priced_text(priced: Priced) -> str:
    """The human-readable report of one priced layout."""
    p = priced.prediction
    lines = [f"layout: {p.candidate.label()} on {priced.world_size} GPUs",
             f"step: {p.step_s:.4g} s   tokens/s per GPU: {priced.tokens_per_s_per_gpu:.4g}",
             f"TFLOP/s per GPU: {priced.tflops_per_gpu('model'):.4g} (whole model), "
             f"{priced.tflops_per_gpu('language'):.4g} (language only)   "
             f"[FLOPs: planner/flops.py, the runtime's StepFlops formulas]",
             "memory per rank: " + ", ".join(f"{k} {v / 1e9:.3g} GB" for k, v in p.peak_memory.items())
             + ("" if p.fits else "  (does NOT fit the machine's memory)")]
    parts = sorted({k for stage in p.breakdown.values() for k in stage})
    lines.append("breakdown (s per step, one rank of each stage): " + "  ".join(parts))
    for stage, d in p.breakdown.items():
        lines.append(f"  {stage:<10}" + "  ".join(f"{k}={d[k]:.3g}" for k in parts if k in d))
    return "\n".join(lines)
