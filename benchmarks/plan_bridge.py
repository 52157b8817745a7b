"""Megatron-Bridge's MIMO tutorial comparison, priced by the planner's cost model (not measured).

Bridge (qwen35-vl-non-colocated-sft, Qwen3.5-VL 27B, bf16, H100) measured +23.0% to +44.7% tokens/s per
GPU: the baseline TP4 PP2 DP2 on 16 GPUs with the encoder inside the LLM's first pipeline stage
(Megatron's single layout: placement first_stage, the encoder at tp 4 dp 2 on stage 0's 8 ranks), the
heterogeneous run the same LLM layout plus one encoder GPU at TP1 (17 GPUs, disaggregated). This script
prices exactly those two layouts (each with its best micro-batch count, sequence parallelism and
recompute that fit 80 GB; the even 32/32 cut) over a sweep of the encoder's tokens per sample, the one
figure of the tutorial's workload we do not know, and prints the terms behind the difference.

    .venv/bin/python benchmarks/plan_gpu_scale.py --rows bridge --markdown
"""

from __future__ import annotations

import itertools
import os

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(os.path.dirname(HERE), "ds_configs", "planner")
# (label, config): the Qwen3.5-VL 27B stand-in (Qwen3-VL structure: full attention in all 64 layers, where
# Qwen3.5 has Gated DeltaNet in 3 of 4) and the Qwen2-VL-structured 27B of the GPU-scale table
# and Qwen3.5-27B itself (qwen3_5_27b.json: Gated DeltaNet in 3 of 4 layers, priced as the chunked delta rule)
MODELS = [("Qwen3.5-VL 27B", "qwen3_5_27b.json"), ("Qwen3.5-VL 27B stand-in", "qwen35vl_27b_standin.json"),
          ("Qwen2-VL 0.7B + 27B", "qwen2vl_vit06b_27b.json")]
SEQ, BATCH = 4096, 32
ENCODER_TOKENS = (1024, 2048, 3072, 4096, 8192)  # per sample, before the 2x2 merge (LLM image tokens / 4)
MICRO = (2, 4, 8, 16, 32)


def _best(cands, spec, wl, machine):
    from ds_hetero.planner import predict

    preds = [predict(c, spec, wl, machine) for c in cands]
    fitting = [p for p in preds if p.fits]
    return max(fitting, key=lambda p: p.tokens_per_s) if fitting else None


def bridge_pair(spec, wl, machine, encoder_tp: int = 4):
    """(baseline on 16 GPUs, heterogeneous on 17): the tutorial's two layouts, each at its best settings.
    `encoder_tp` 1: a hypothesis, the baseline's encoder replicated over its stage's 4 tp ranks (each
    tp rank encodes its dp shard's images whole) instead of split."""
    from ds_hetero.planner import Candidate, StageChoice

    options = list(itertools.product(MICRO, (False, True), (False, True)))  # micro-batches, sp, recompute
    base = [Candidate("first_stage", StageChoice(encoder_tp, 2, recompute=rc),
                      StageChoice(4, 2, 1, sp, pp=2, recompute=rc), m) for m, sp, rc in options]
    hetero = [Candidate("disaggregated", StageChoice(1, 1, ranks=(0,)),
                        StageChoice(4, 2, 1, sp, tuple(range(1, 17)), pp=2, recompute=rc), m)
              for m, sp, rc in options]
    return _best(base, spec, wl, machine), _best(hetero, spec, wl, machine)


def terms(base, hetero) -> dict[str, float]:
    """The seconds per step behind the difference (one rank of each rank set)."""
    bv, bl = base.breakdown["vision"], base.breakdown["language"]
    hv, hl = hetero.breakdown["vision"], hetero.breakdown["language"]
    return {"base encoder on stage 0 (compute + tp)": bv["compute"] + bv["tp"],
            "base LLM slowest stage (compute + tp)": bl["compute"] + bl["tp"],
            "base bubble": bl.get("bubble", 0.0),
            "hetero encoder GPU busy": hv["compute"] + hv["tp"] + hv["dp"] + hv["optimizer"],
            "hetero LLM slowest stage (compute + tp)": hl["compute"] + hl["tp"],
            "hetero LLM ranks idle": hl.get("bubble", 0.0)}


def bridge_table(machine, markdown: bool = True) -> str:
    from ds_hetero.planner.flops import vision_work
    from ds_hetero.planner.model_source import load_hf_config
    from ds_hetero.planner.model_spec import model_spec
    from ds_hetero.planner.step_model import model_flops
    from ds_hetero.planner.workload import Workload, image_tokens_of

    head = ["model", "enc tok/sample", "encoder share of FLOPs", "baseline (16 GPUs)", "step", "heterogeneous (17)",
            "step", "step shorter", "tokens/s/GPU gain", "base: encoder on stage 0", "base: LLM stage",
            "base: bubble", "hetero: encoder GPU busy", "hetero: LLM stage", "hetero: LLM idle",
            "gain if the base's encoder were replicated over tp"]
    rows = []
    for label, name in MODELS:
        spec = model_spec(load_hf_config(os.path.join(CONFIGS, name)))
        for enc in ENCODER_TOKENS:
            wl = Workload(SEQ, image_tokens_of(spec, None, enc), BATCH, dtype_bytes=2, zero=1)
            base, hetero = bridge_pair(spec, wl, machine)
            if base is None or hetero is None:
                rows.append([label, str(enc), "-", "none fits" if base is None else base.candidate.label()]
                            + ["-"] * (len(head) - 4))
                continue
            share = vision_work(spec, wl, BATCH, 1).flops / model_flops(spec, wl, machine.causal)
            gain = hetero.tokens_per_s / 17 / (base.tokens_per_s / 16) - 1
            t = terms(base, hetero)
            rows.append([label, str(enc), f"{100 * share:.1f}%", base.candidate.label(), f"{base.step_s:.2f} s",
                         hetero.candidate.label(), f"{hetero.step_s:.2f} s",
                         f"{100 * (1 - hetero.step_s / base.step_s):.1f}%", f"{100 * gain:+.1f}%",
                         *(f"{v:.2f} s" for v in t.values())])
            replicated, _ = bridge_pair(spec, wl, machine, encoder_tp=1)
            rows[-1].append(f"{100 * (hetero.tokens_per_s / 17 / (replicated.tokens_per_s / 16) - 1):+.1f}%"
                            if replicated else "-")
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                         + ["| " + " | ".join(r) + " |" for r in rows])
    return "\n".join("  ".join(r) for r in [head] + rows)
