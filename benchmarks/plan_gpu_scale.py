"""The planner at GPU scale: its pick and predicted gain over the best single-layout configuration.

    python recipes/plan_gpu_scale.py                    # the README table (H100 profile), ~10 min
    python recipes/plan_gpu_scale.py --machine h200 --markdown

Models (configs in ds_configs/planner/, LLaVA structure): a ViT-L/14 at 336 px (0.3B, 576 tokens
per image, CLIP) or a 6B ViT (CLIP structure, 4096 wide, 32 layers), with a 7B (Llama-2 shape) or
a 70B (Llama-2-70B shape, GQA 8) language model. Scale points: GPUs x sequence length; the
global batch holds ~16k tokens per GPU (at least 8 samples), images are 1152 tokens per 4k of
sequence. ZeRO 1 and ZeRO 3 are both searched (bf16, AdamW); memory limit = the device's HBM.

"best single layout" = the best colocated configuration whose vision stage uses the language
stage's tp x dp split (what one LLM-centric layout gives the encoder); "gain" = its step time
over the pick's (= tokens/s and TFLOPS/GPU ratio, same work); "best disagg." = the best
disaggregated configuration and its gain over the same baseline.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(os.path.dirname(HERE), "ds_configs", "planner")
MODELS = [("ViT-L 0.3B", "7B", "llava_vitl_7b.json"), ("ViT-L 0.3B", "70B", "llava_vitl_70b.json"),
          ("ViT 6B", "7B", "llava_vit6b_7b.json"), ("ViT 6B", "70B", "llava_vit6b_70b.json")]
POINTS = [(8, 4096), (64, 16384), (1024, 4096), (1024, 32768)]


def run_point(path, gpus, seq, machine):
    from ds_hetero.planner import plan
    from ds_hetero.planner.search import base_config

    batch = max(8, gpus * 16384 // seq)
    image_tokens = 1152 * seq // 4096
    preds = []
    for zero in (1, 3):
        p = plan(path, gpus, seq, image_tokens, batch, machine, base=base_config(None, batch, zero, True))
        preds += [(x, zero) for x in p.predictions]
    fitting = sorted([x for x in preds if x[0].fits], key=lambda x: x[0].step_s)
    homog = next((x for x in fitting if x[0].candidate.homogeneous), None)
    disagg = next((x for x in fitting if x[0].candidate.disaggregated), None)
    return batch, image_tokens, (fitting[0] if fitting else None), homog, disagg, len(preds)


def fmt(entry):
    if entry is None:
        return "none fits", "-"
    pred, zero = entry
    return f"{pred.candidate.label()} Z{zero}", f"{pred.tflops_per_device:.0f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="h100")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    from ds_hetero.planner import machine_profile

    machine = machine_profile(args.machine)
    head = ["vision", "LLM", "GPUs", "seq", "img tok", "batch", "planner pick", "TFLOPS/GPU", "best single layout",
            "TFLOPS/GPU", "gain", "best disagg.", "gain"]
    rows = []
    t0 = time.perf_counter()
    for vision, llm, name in MODELS:
        for gpus, seq in POINTS:
            batch, k, best, homog, disagg, n = run_point(os.path.join(CONFIGS, name), gpus, seq, machine)
            gain = f"{100 * (homog[0].step_s / best[0].step_s - 1):+.1f}%" if best and homog else "-"
            dgain = f"{100 * (homog[0].step_s / disagg[0].step_s - 1):+.1f}%" if disagg and homog else "-"
            rows.append([vision, llm, str(gpus), f"{seq // 1024}k", str(k), str(batch), *fmt(best), *fmt(homog), gain,
                         fmt(disagg)[0], dgain])
            print(f"[{time.perf_counter() - t0:5.0f}s] {vision} + {llm}, {gpus} GPUs, {seq}: {n} candidates",
                  file=sys.stderr, flush=True)
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(x) for x in col) for col in zip(head, *rows)]
        for r in [head] + rows:
            print("  ".join(x.ljust(w) for x, w in zip(r, widths)))
    print(f"\nmachine {machine.name}: {machine.source}")


if __name__ == "__main__":
    main()
