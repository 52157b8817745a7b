"""Megatron-Bridge's MIMO tutorial comparison, priced by the planner's cost model (not measured).

Bridge (qwen35-vl-non-colocated-sft, Qwen3.5-VL 27B, bf16, H100) measured +23.0% to +44.7% tokens/s per
GPU: the baseline TP4 PP2 DP2 on 16 GPUs with the encoder inside the LLM's first pipeline stage
(Megatron's single layout: placement first_stage, the encoder at tp 4 dp 2 on stage 0's 8 ranks), the
heterogeneous run the same LLM layout plus one encoder GPU at TP1 (17 GPUs, disaggregated). This script
prices exactly those two layouts at the tutorial's own settings (`tutorial_pair`: language-local
micro-batch 1, global batch 32 and 64, Bridge's recipe without sequence parallelism or recompute, the
even 32/32 cut) with each language row at its sample's length (benchmarks/plan_public.py's docstring says
why), over the encoder's tokens per sample and the sample's text tokens, and prints the terms behind the
difference: the encoder's seconds per micro-batch on a stage-0 rank against the break-even, the seconds
it would need there for the published gain (`encoder_break_even`). The last rows price the LLM rows
padded to the sequence length (the reading before: Bridge's fixed-shape path), for comparison.

    .venv/bin/python benchmarks/plan_gpu_scale.py --rows bridge --markdown
"""

from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(os.path.dirname(HERE), "ds_configs", "planner")
MODEL = ("Qwen3.5-VL 27B", "qwen3_5_27b.json")  # Qwen3.5-27B's text model (Gated DeltaNet in 3 of 4 layers)
# (encoder tokens per sample, text tokens per sample) of the table: RDR's 768x768 images (2304 encoder
# tokens) with short and long text, and smaller / larger images (CORD-v2's and MedPix's vary)
POINTS = ((1024, 256), (2304, 64), (2304, 256), (2304, 1024), (4096, 256), (4096, 1024))


# The tutorial's own settings (tutorials/megatron_mimo/qwen35-vl-non-colocated-sft.md and
# examples/megatron_mimo/qwen35_vl/slurm_sft.sh): language-local micro-batch 1 on both sides ("matched
# language-local microbatch size": the baseline MBS 1, MIMO's global MBS 2 over language dp 2), so each
# step runs global batch / 2 micro-batches and the encoder GPU encodes 2 samples per micro-batch; global
# batch 32 and 64, sequence 2048 and 4096 (the tutorial's table). Bridge's Qwen3.5-VL 27B SFT recipe
# (recipes/qwen_vl/qwen35_vl.py: sequence_parallel False, recompute_granularity None): no sequence
# parallelism, no recompute, which the tutorial does not override; recompute only where the cost model's
# memory says 80 GB do not hold the step without it.
TUTORIAL_BATCHES = (32, 64)
TUTORIAL_SEQS = (2048, 4096)
LANGUAGE_DP = 2


def tutorial_pair(spec, wl, machine):
    """(baseline on 16 GPUs, heterogeneous on 17) at the tutorial's settings (TUTORIAL_* above): the
    encoder at the LLM's tp 4 inside pipeline stage 0 against the encoder alone on one GPU."""
    from ds_hetero.planner import Candidate, StageChoice, predict

    m = wl.global_batch // LANGUAGE_DP  # language-local micro-batch of 1 sample

    def layouts(rc: bool):
        base = Candidate("first_stage", StageChoice(4, LANGUAGE_DP, recompute=rc),
                         StageChoice(4, LANGUAGE_DP, 1, False, pp=2, recompute=rc), m)
        hetero = Candidate("disaggregated", StageChoice(1, 1, ranks=(0,)),
                           StageChoice(4, LANGUAGE_DP, 1, False, tuple(range(1, 17)), pp=2, recompute=rc), m)
        return predict(base, spec, wl, machine), predict(hetero, spec, wl, machine)

    plain = layouts(False)
    with_rc = layouts(True)
    return tuple(p if p.fits else r for p, r in zip(plain, with_rc))


def per_gpu_gain(base, hetero) -> float:
    """Tokens/s per GPU of the 17-GPU run over the 16-GPU baseline, in percent."""
    return 100 * (hetero.tokens_per_s / 17 / (base.tokens_per_s / 16) - 1)


def encoder_break_even(base, hetero, gain_percent: float) -> float:
    """Seconds per micro-batch the baseline's encoder would need on each stage-0 rank (forward + backward,
    tp collectives included) for the per-GPU gain to reach `gain_percent`, the heterogeneous step held as
    priced. While stage 0 is the pipeline's slowest stage, the 1F1B step grows by M seconds per second
    added to stage 0's time per micro-batch (step_time.one_f_one_b: (M - 1) max t + sum t)."""
    m = base.candidate.micro_batches
    target = hetero.step_s * (1 + gain_percent / 100) * 17 / 16  # the baseline step that gives this gain
    encoder = (base.breakdown["vision"]["compute"] + base.breakdown["vision"]["tp"]) / m
    return encoder + (target - base.step_s) / m


def bridge_table(machine, markdown: bool = True) -> str:
    from ds_hetero.planner.flops import vision_work
    from ds_hetero.planner.model_source import load_hf_config
    from ds_hetero.planner.model_spec import model_spec
    from ds_hetero.planner.step_model import model_flops
    from ds_hetero.planner.workload import Workload, image_tokens_of

    head = ["enc tok/sample", "text tok", "LLM row", "batch", "encoder share of FLOPs", "baseline (16 GPUs)", "step",
            "heterogeneous (17)", "step", "step shorter", "tokens/s/GPU gain", "base: encoder per mb on stage 0",
            "base: LLM stage per mb", "hetero: encoder GPU per mb", "encoder per mb for +23% / +30%"]
    spec = model_spec(load_hf_config(os.path.join(CONFIGS, MODEL[1])))
    rows = []
    cases = [(enc, text, -(-(enc // 4 + text) // 128) * 128, batch) for enc, text in POINTS for batch in TUTORIAL_BATCHES]
    cases += [(enc, "padded", seq, batch) for enc in (2304,) for seq in TUTORIAL_SEQS for batch in (32,)]
    for enc, text, seq, batch in cases:
        wl = Workload(seq, image_tokens_of(spec, None, enc), batch, dtype_bytes=2, zero=1)
        base, hetero = tutorial_pair(spec, wl, machine)
        m = base.candidate.micro_batches
        share = vision_work(spec, wl, batch, 1).flops / model_flops(spec, wl, machine.causal)
        bv, bl, hv = base.breakdown["vision"], base.breakdown["language"], hetero.breakdown["vision"]
        need = "/".join(f"{1e3 * encoder_break_even(base, hetero, g):.0f}" for g in (23.0, 30.0))
        rows.append([str(enc), str(text), str(seq), str(batch), f"{100 * share:.1f}%", base.candidate.label(),
                     f"{base.step_s:.2f} s", hetero.candidate.label(), f"{hetero.step_s:.2f} s",
                     f"{100 * (1 - hetero.step_s / base.step_s):.1f}%", f"{per_gpu_gain(base, hetero):+.1f}%",
                     f"{1e3 * (bv['compute'] + bv['tp']) / m:.1f} ms", f"{1e3 * (bl['compute'] + bl['tp']) / m:.1f} ms",
                     f"{1e3 * (hv['compute'] + hv['tp']) / m:.1f} ms", f"{need} ms"])
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                          + ["| " + " | ".join(r) + " |" for r in rows])
    return "\n".join("  ".join(r) for r in [head] + rows)
