"""The planner at GPU scale: its picks against the tuned Megatron baseline and against today's single layout.

    .venv/bin/python benchmarks/plan_gpu_scale.py --markdown                  # every row (H100 profile); long
    .venv/bin/python benchmarks/plan_gpu_scale.py --rows new --markdown       # the 70B pp / Megatron-Bridge rows only
    .venv/bin/python benchmarks/plan_gpu_scale.py --rows moe --markdown       # Qwen3-VL-30B-A3B / 235B-A22B (ep searched)
    .venv/bin/python benchmarks/plan_gpu_scale.py --rows bridge --markdown    # Bridge's own TP4 PP2 DP2 comparison

Models (configs in ds_configs/planner/): LLaVA structure, a ViT-L/14 at 336 px (0.3B, 576 tokens
per image, CLIP) or a 6B ViT (CLIP structure, 4096 wide, 32 layers), with a 7B (Llama-2 shape) or
a 70B (Llama-2-70B shape, GQA 8) language model; and Qwen2-VL structure (2x2 spatial merge: the
encoder sees 4x the image tokens the language model receives), a 6.9B tower (4096 wide, 32
layers) with a 72B language model (Qwen2-72B shape), and Qwen2-VL's 0.7B tower with a 27B
language model (5120 wide, 64 layers, GQA 8). LLaVA points: GPUs x sequence length, the global
batch ~16k tokens per GPU (at least 8 samples), 1152 image tokens per 4k of sequence. ZeRO 1 and
ZeRO 3 are both searched (bf16, AdamW); memory limit = the device's HBM.

Columns:
  runnable pick        the best configuration the engine runs today (its checks accept it)
  best overall         the best of everything the cost model prices, including what the engine
                       does not run yet (a language pipeline, recompute, per-stage ZeRO)
  today's baseline     colocated, the encoder on the language's tp x (cp x dp) as plain dp
  Megatron (tuned)     one (tp, cp, pp, dp) for the whole model, the encoder at the language's
                       tp on the first pipeline stage, replicated over cp, once per micro-batch;
                       tp/cp/pp/dp, micro-batches, sequence parallelism, recompute and the first
                       stage's layers tuned; "even" = the best with an even cut
  gains                tokens/s of the pick over the baseline (same work per step)
The Megatron-Bridge row (27B, "TP4 PP2 DP2 + an encoder GPU") compares per GPU: the
heterogeneous pick on 17 GPUs (the encoder on its own GPU) against Megatron on 16.

MoE rows (`--rows moe`; ds_configs/planner/qwen3vl_30b_a3b.json, qwen3vl_235b_a22b.json: the public
configs' shapes, 128 experts, top-8, Qwen3-VL's 27-layer 1152-wide tower with DeepStack): expert
parallelism is searched for every language layout (ep folded out of cp x dp, Megatron's too); the
table adds the best candidate with ep 1 (what the planner could price before) and the gain ep
gives. `--rows bridge`: plan_bridge.py, Bridge's own two layouts priced directly.
These are cost-model figures, not measurements.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(os.path.dirname(HERE), "ds_configs", "planner")
LLAVA = [("ViT-L 0.3B", "7B", "llava_vitl_7b.json"), ("ViT-L 0.3B", "70B", "llava_vitl_70b.json"),
         ("ViT 6B", "7B", "llava_vit6b_7b.json"), ("ViT 6B", "70B", "llava_vit6b_70b.json")]
POINTS = [(8, 4096), (64, 16384), (1024, 4096), (1024, 32768)]
# (vision, LLM, config, GPUs, seq, encoder tokens per sample, batch, GPUs of the Megatron baseline)
NEW = [("ViT 6.9B (Qwen2-VL)", "72B", "qwen2vl_vit6b_70b.json", 64, 8192, 16384, 128, None),
       ("ViT 0.7B (Qwen2-VL)", "27B", "qwen2vl_vit06b_27b.json", 16, 4096, 4096, 32, None),
       ("ViT 0.7B (Qwen2-VL)", "27B", "qwen2vl_vit06b_27b.json", 17, 4096, 4096, 32, 16)]
# (..., batch, ZeRO stages searched, micro-batches (None: every divisor up to 64), placements, max tp); the
# 235B row's search is narrowed for planning time on the shared 2-core machine: the ZeRO 1 base only (the
# language's ZeRO 3 is still searched per stage), 32 micro-batches, colocated and first_stage rows, tp <= 4
MOE = [("ViT 0.5B (Qwen3-VL)", "30B-A3B", "qwen3vl_30b_a3b.json", 16, 4096, 4096, 64, (1, 3), None, None, None),
       ("ViT 0.5B (Qwen3-VL)", "235B-A22B", "qwen3vl_235b_a22b.json", 64, 4096, 4096, 256, (1,), (32,),
        ("colocated",), 4)]


def search(path, gpus, seq, batch, machine, image_tokens=None, encoder_tokens=None, placements=None, zeros=(1, 3),
           micro_batches=None, max_tp=None):
    from ds_hetero.planner import plan
    from ds_hetero.planner.search import base_config

    preds, n, spec = [], 0, None
    for zero in zeros:
        p = plan(path, gpus, seq, image_tokens, batch, machine, base=base_config(None, batch, zero, True),
                 encoder_tokens=encoder_tokens, placements=placements or ("colocated", "disaggregated"),
                 micro_batches=micro_batches, max_tp=max_tp)
        preds += [(x, zero) for x in p.predictions]
        n += len(p.predictions)
        spec = p.spec
    fitting = sorted([x for x in preds if x[0].fits], key=lambda x: -x[0].tokens_per_s)
    pick = {
        "runnable": next((x for x in fitting if x[0].runnable), None),
        "overall": fitting[0] if fitting else None,
        "today": next((x for x in fitting if x[0].candidate.homogeneous and x[0].runnable), None),
        "megatron": next((x for x in fitting if x[0].candidate.megatron), None),
        "even": next((x for x in fitting if x[0].candidate.megatron and x[0].candidate.pp_layers is None), None),
        "no_ep": next((x for x in fitting if x[0].runnable and x[0].candidate.language.ep == 1), None),
        "megatron_no_ep": next((x for x in fitting if x[0].candidate.megatron and x[0].candidate.language.ep == 1),
                               None),
    }
    return pick, n, spec


def fmt(entry):
    if entry is None:
        return "none fits", "-"
    pred, zero = entry
    return f"{pred.candidate.label()} Z{zero}", f"{pred.tflops_per_device:.0f}"


def gain(a, b, per_gpu=None):
    """tokens/s of a over b; per_gpu = (GPUs of a, GPUs of b) compares per GPU."""
    if a is None or b is None:
        return "-"
    r = a[0].tokens_per_s / b[0].tokens_per_s
    if per_gpu:
        r *= per_gpu[1] / per_gpu[0]
    return f"{100 * (r - 1):+.1f}%"


def row(vision, llm, gpus, seq, k, enc, batch, pick, base=None, base_gpus=None):
    meg = base["megatron"] if base else pick["megatron"]
    even = base["even"] if base else pick["even"]
    today = base["today"] if base else pick["today"]
    per = (gpus, base_gpus) if base_gpus else None
    return [vision, llm, str(gpus), f"{seq // 1024}k", f"{k}/{enc}", str(batch), *fmt(pick["runnable"]),
            *fmt(pick["overall"]), *fmt(today), *fmt(meg), fmt(even)[0],
            gain(pick["runnable"], meg, per), gain(pick["runnable"], today, per),
            gain(pick["overall"], meg, per), gain(pick["overall"], even, per), gain(pick["overall"], today, per)]


HEAD = ["vision", "LLM", "GPUs", "seq", "img tok LLM/enc", "batch", "runnable pick", "TFLOPS/GPU",
        "best overall (modelled)", "TFLOPS/GPU", "today's baseline", "TFLOPS/GPU", "Megatron (tuned)",
        "TFLOPS/GPU", "Megatron (even cut)", "runnable vs Megatron", "runnable vs today",
        "best vs Megatron", "best vs Megatron even", "best vs today"]


MOE_HEAD = ["runnable pick with ep 1", "TFLOPS/GPU", "runnable vs ep 1", "Megatron with ep 1",
            "Megatron tuned vs its ep 1"]


def table(head, rows, markdown):
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                         + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(r, widths)) for r in [head] + rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="h100")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--rows", choices=("all", "new", "llava", "moe", "bridge"), default="all")
    ap.add_argument("--gpus", type=int, nargs="+", help="only the LLaVA points at these GPU counts")
    ap.add_argument("--models", nargs="+", help="only these LLaVA or MoE configs (file names)")
    args = ap.parse_args(argv)
    from ds_hetero.planner import machine_profile

    machine = machine_profile(args.machine)
    rows, t0 = [], time.perf_counter()
    megatron_at = {}
    if args.rows in ("all", "new"):
        for vision, llm, name, gpus, seq, enc, batch, base_gpus in NEW:
            path = os.path.join(CONFIGS, name)
            pick, n, spec = search(path, gpus, seq, batch, machine, encoder_tokens=enc)
            megatron_at[(name, gpus)] = pick
            base = megatron_at.get((name, base_gpus)) if base_gpus else None
            k = enc // spec.vision.merge
            rows.append(row(vision, llm, gpus, seq, k, enc, batch, pick, base, base_gpus))
            print(f"[{time.perf_counter() - t0:5.0f}s] {vision} + {llm}, {gpus} GPUs, {seq}: {n} candidates",
                  file=sys.stderr, flush=True)
    moe_rows = []
    if args.rows in ("all", "moe"):
        for vision, llm, name, gpus, seq, enc, batch, zeros, micro, placements, max_tp in MOE:
            if args.models and name not in args.models:
                continue
            pick, n, spec = search(os.path.join(CONFIGS, name), gpus, seq, batch, machine, encoder_tokens=enc,
                                   zeros=zeros, micro_batches=micro, placements=placements, max_tp=max_tp)
            k = enc // spec.vision.merge
            moe_rows.append(row(vision, llm, gpus, seq, k, enc, batch, pick)
                            + [*fmt(pick["no_ep"]), gain(pick["runnable"], pick["no_ep"]),
                               fmt(pick["megatron_no_ep"])[0], gain(pick["megatron"], pick["megatron_no_ep"])])
            print(f"[{time.perf_counter() - t0:5.0f}s] {vision} + {llm}, {gpus} GPUs, {seq}: {n} candidates",
                  file=sys.stderr, flush=True)
    if args.rows == "bridge":
        from plan_bridge import bridge_table

        print(bridge_table(machine, markdown=args.markdown))
    if args.rows in ("all", "llava"):
        for vision, llm, name in LLAVA:
            if args.models and name not in args.models:
                continue
            for gpus, seq in POINTS:
                if args.gpus and gpus not in args.gpus:
                    continue
                batch, k = max(8, gpus * 16384 // seq), 1152 * seq // 4096
                pick, n, _ = search(os.path.join(CONFIGS, name), gpus, seq, batch, machine, image_tokens=k)
                rows.append(row(vision, llm, gpus, seq, k, k, batch, pick))
                print(f"[{time.perf_counter() - t0:5.0f}s] {vision} + {llm}, {gpus} GPUs, {seq}: {n} candidates",
                      file=sys.stderr, flush=True)
    for head, body in ((HEAD, rows), (HEAD + MOE_HEAD, moe_rows)):
        if body:
            print(table(head, body, args.markdown))
    print(f"\nmachine {machine.name}: {machine.source}; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
