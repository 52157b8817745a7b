"""The cost model against published GPU runs: each run priced from its public settings, the published
figure beside the prediction (cost model on the H100 profile; nothing here is measured by us).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/plan_public.py          # a table
    PYTHONPATH=$PWD .venv/bin/python benchmarks/plan_public.py --json   # [{"name", "unit", "published", "predicted"}]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/plan_public.py --terms  # the Qwen3.6 card's breakdown
    PYTHONPATH=$PWD .venv/bin/python benchmarks/plan_public.py --overlap-launches  # launches hidden by device work

Runs (settings from the public pages; /work/shared/reference/data-path-and-public-figures.md):
1. Megatron-Bridge's Qwen3.6-35B-A3B SFT card: 16 x H100, TP1 PP2 EP8, MBS 1, GBS 32, seq 4096 unpacked,
   448x448 images (MedPix), full recompute of every layer (1 layer per recompute chunk), bf16:
   57.7 TFLOP/s/GPU, 2507 tokens/s/GPU, 3.27 s/step.
2. Bridge's Gemma-4-26B-A4B SFT card: 8 x H100, TP4 EP8, MBS 1, GBS 32, CORD-v2, vision frozen: 32.2 TFLOP/s/GPU.
3. Bridge's Qwen3.5-VL 27B MIMO tutorial: TP4 PP2 DP2 on 16 GPUs (the encoder in the LLM's first pipeline
   stage) against the same plus one encoder GPU at TP1 (17 GPUs): +23.0% to +44.7% tokens/s per GPU.

Models (ds_configs/planner/, hand-written from the public config.json values, nothing downloaded):
- qwen3_5_35b_a3b.json: Qwen3.5-35B-A3B's config; Qwen3.6-35B-A3B reuses the Qwen3.5 architecture (miles'
  Qwen3.6 recipe page: "reuses the Qwen3.5 spec", 256 experts, top-8, shared expert 512).
- gemma4_26b_a4b.json: google/gemma-4-26B-A4B's config.json (30 layers of 2816, 16 heads / 8 kv of 256,
  full layers 2 kv of 512, dense MLP 2112 beside 128 experts of 704, top-8, vocabulary 262144; vision 27 x
  1152, patch 16, 280 soft tokens per image).
- qwen3_5_27b.json: Qwen3.5/3.6-27B's text config (64 layers of 5120, 24 heads / 4 kv of 256, ffn 17408,
  Gated DeltaNet 16 key / 48 value heads of 128, every 4th layer full attention, vocabulary 248320) with the
  Qwen3.5 vision tower (27 x 1152, patch 16, 2x2 merge) projecting to 5120.

Assumptions where a public setting leaves something unknown (each figure is the range over them; no
constant is fitted to any run):
- FLOPs formula of the published TFLOP/s: Bridge's formula is not reproduced; the prediction's FLOPs are
  planner/flops.py's (the runtime's StepFlops), with the causal attention counted at half (flash kernels'
  work) and at full (a formula that counts the whole score matrix): the range.
- Qwen3.6 card: one 448x448 image per sample (28 x 28 patches = 784 encoder tokens, 196 after the merge);
  Megatron's distributed optimizer priced as ZeRO 1; the encoder in the first pipeline stage at the LLM's
  tp 1 and dp 8 (Bridge's VLM layout); HybridEP's dispatch priced as an all-to-all.
- Gemma card: sequence 2048 or 4096 (not stated: the range), one image of 280 soft tokens; Megatron's EP8
  over TP4 x DP2 (expert tensor parallelism 1) is priced as ds_hetero's ep 2 folded out of dp 2 with
  sequence parallelism (the same expert FLOPs per rank, 64 instead of 16 experts per rank).
- MIMO tutorial (plan_bridge.tutorial_pair): its own settings where it states them: global batch 32 and
  64, sequence 2048 and 4096, language-local micro-batch 1 on both sides (global batch / 2 micro-batches;
  the encoder GPU encodes 2 samples per micro-batch), Bridge's Qwen3.5-VL 27B SFT recipe for the rest
  (no sequence parallelism, no recompute unless 80 GB do not hold the step), the even 32/32 cut. Each
  language row is its sample's own length, not the sequence length: Bridge's Qwen-VL collate pads a
  micro-batch to its longest sample rounded up to 128 (`prepare_padded_or_packed_sequence_batch`,
  pad_to_max_length False; the sequence length only truncates), and the tutorial's own table shows it
  (MedPix: 23.8% shorter steps at sequence 2048, 23.7% at 4096). A row = the image's tokens + 64-1024 text
  tokens (chat template, question, caption or receipt JSON: not published), rounded up to 128, at most the
  sequence. Images: RDR's are 768x768 (the tutorial: 48 x 48 = 2304 encoder tokens, 576 after the merge);
  CORD-v2's and MedPix's sizes vary and are not stated: 1024-4096 encoder tokens. The second MIMO row is
  RDR's alone (its published deltas: +23.3% to +44.7%).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
CONFIGS = os.path.join(os.path.dirname(HERE), "ds_configs", "planner")
BASE = {"zero_optimization": {"stage": 1}, "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}}}
CAUSAL_COUNTED = (0.5, 1.0)  # share of the causal score matrix a FLOPs formula counts (see the docstring)


def _config(batch: int, section: dict) -> dict:
    return {**BASE, "train_batch_size": batch, "hetero_parallel": section}


def _recounted(priced, spec_wl, causal: float) -> float:
    """TFLOP/s per GPU with the attention counted at `causal` of the score matrix (the step time unchanged)."""
    spec, wl = spec_wl
    return model_flops_tflops(spec, wl, causal, priced.step_s, priced.world_size)


def _spec_wl(model: str, seq: int, batch: int, encoder_tokens: int):
    from ds_hetero.planner.model_source import load_hf_config
    from ds_hetero.planner.model_spec import model_spec
    from ds_hetero.planner.workload import Workload, image_tokens_of

    spec = model_spec(load_hf_config(model))
    return spec, Workload(seq, image_tokens_of(spec, None, encoder_tokens), batch, dtype_bytes=2, zero=1)


def qwen36_card(machine) -> list[dict]:
    """Bridge's Qwen3.6-35B-A3B SFT card, priced through `--price`'s code (validate's checks included)."""
    from ds_hetero.planner.price import price

    model = os.path.join(CONFIGS, "qwen3_5_35b_a3b.json")
    section = {"placement": "first_stage", "micro_batches": 4, "stages": {
        "vision": {"tp": 1, "dp": 8, "recompute": True},
        "language": {"tp": 1, "dp": 8, "pp": 2, "ep": 8, "recompute": True}}}
    priced = price(model, _config(32, section), 16, 4096, machine, encoder_tokens=784)
    tflops = [_recounted(priced, _spec_wl(model, 4096, 32, 784), c) for c in CAUSAL_COUNTED]
    return [row("Qwen3.6-35B-A3B SFT card: TFLOP/s per GPU", "TFLOP/s/GPU", 57.7, tflops),
            row("Qwen3.6-35B-A3B SFT card: tokens/s per GPU", "tokens/s/GPU", 2507, priced.tokens_per_s_per_gpu),
            row("Qwen3.6-35B-A3B SFT card: step time", "s", 3.27, priced.step_s)]


def qwen36_terms(machine) -> str:
    """The Qwen3.6 card's priced breakdown (`--price`'s text) and, per micro-batch on one rank of each language
    pipeline stage, its compute split into GEMMs, element-wise bytes and operator launches (cost.compute_parts;
    with the card's full recompute the forward runs twice)."""
    from ds_hetero.planner.cost import compute_parts
    from ds_hetero.planner.flops import language_work
    from ds_hetero.planner.price import price, priced_text

    model = os.path.join(CONFIGS, "qwen3_5_35b_a3b.json")
    section = {"placement": "first_stage", "micro_batches": 4, "stages": {
        "vision": {"tp": 1, "dp": 8, "recompute": True},
        "language": {"tp": 1, "dp": 8, "pp": 2, "ep": 8, "recompute": True}}}
    lines = [priced_text(price(model, _config(32, section), 16, 4096, machine, encoder_tokens=784))]
    spec, wl = _spec_wl(model, 4096, 32, 784)
    for stage, last in ((0, False), (1, True)):
        work = language_work(spec, wl, 1, 1, 1, machine.causal, False, spec.language.layers // 2, last, 8)
        parts = compute_parts(work, machine)
        per_mb = {k: 2 * f + b for k, (f, b) in parts.items()}  # forward, its recompute, backward
        lines.append(f"language stage {stage} per micro-batch (forward x2 + backward): "
                     + "  ".join(f"{k} {1e3 * v:.1f} ms" for k, v in per_mb.items())
                     + f"   ({work.flops / 1e12:.1f} TFLOP, {work.ops} operator calls per forward)")
    return "\n".join(lines)


def gemma4_card(machine) -> list[dict]:
    """Bridge's Gemma-4-26B-A4B SFT card (vision frozen), over the unknown sequence length. Priced with the cost
    model directly (step_model.predict), not through `--price`: Megatron's layout shards the sequence over tp
    (sequence parallelism, which expert parallelism over TP x DP relies on), and ds_hetero's engine refuses
    sequence parallelism for Gemma 4 (its bidirectional image masks), so validate refuses that config."""
    from ds_hetero.planner import Candidate, StageChoice
    from ds_hetero.planner.step_model import predict

    model = os.path.join(CONFIGS, "gemma4_26b_a4b.json")
    cand = Candidate("colocated", StageChoice(4, 2), StageChoice(4, 2, 1, True, ep=2), 16)
    tflops, tokens = [], []
    for seq in (2048, 4096):
        spec, wl = _spec_wl_tokens(model, seq, 32, 280)
        pred = predict(cand, spec, wl, machine)
        tflops += [model_flops_tflops(spec, wl, c, pred.step_s, 8) for c in CAUSAL_COUNTED]
        tokens.append(wl.real_tokens() / pred.step_s / 8)
    return [row("Gemma-4-26B-A4B SFT card: TFLOP/s per GPU", "TFLOP/s/GPU", 32.2, tflops),
            row("Gemma-4-26B-A4B SFT card: tokens/s per GPU", "tokens/s/GPU", 1028, tokens)]


def model_flops_tflops(spec, wl, causal: float, step_s: float, gpus: int) -> float:
    from ds_hetero.planner.step_model import model_flops

    return model_flops(spec, wl, causal) / step_s / gpus / 1e12


def _spec_wl_tokens(model: str, seq: int, batch: int, image_tokens: int):
    """(spec, workload) with the vision stage frozen, as the card trains it (its FLOPs: forward only)."""
    from dataclasses import replace

    from ds_hetero.families import adapter_for
    from ds_hetero.planner.frozen import resolve_freeze
    from ds_hetero.planner.model_source import load_model
    from ds_hetero.planner.model_spec import model_spec
    from ds_hetero.planner.workload import Workload

    hf, instance = load_model(model)
    spec = model_spec(hf)
    freeze = resolve_freeze({"stages": {"vision": {"freeze": True}}}, adapter_for(instance))
    return spec, replace(Workload(seq, image_tokens, batch, dtype_bytes=2, zero=1), freeze=freeze)


RDR_ENCODER_TOKENS = 2304  # RDR's fixed 768x768 images: 48 x 48 patches of 16 px (the tutorial's dataset note)
ENCODER_TOKENS = (1024, RDR_ENCODER_TOKENS, 4096)  # CORD-v2 / MedPix: variable sizes, not stated
TEXT_TOKENS = (64, 256, 1024)  # a sample's text tokens beside its image: not published
ROW_MULTIPLE = 128  # Bridge's collate pads a micro-batch to its longest sample rounded up to this


def sample_row(seq: int, encoder_tokens: int, text_tokens: int, merge: int = 4) -> int:
    """A language row at its sample's length (the docstring's MIMO assumptions): image + text tokens,
    rounded up to ROW_MULTIPLE, truncated at the sequence length."""
    return min(seq, -(-(encoder_tokens // merge + text_tokens) // ROW_MULTIPLE) * ROW_MULTIPLE)


def mimo_gains(machine, encoder_tokens=ENCODER_TOKENS) -> list[float]:
    """Per-GPU gains of 16 + 1 encoder GPU over 16 at the tutorial's settings, over the unknowns."""
    from plan_bridge import TUTORIAL_BATCHES, TUTORIAL_SEQS, per_gpu_gain, tutorial_pair

    model = os.path.join(CONFIGS, "qwen3_5_27b.json")
    priced = {}
    for batch in TUTORIAL_BATCHES:
        for seq in TUTORIAL_SEQS:
            for enc in encoder_tokens:
                for text in TEXT_TOKENS:
                    key = (batch, sample_row(seq, enc, text), enc)
                    if key not in priced:
                        spec, wl = _spec_wl(model, key[1], batch, enc)
                        priced[key] = per_gpu_gain(*tutorial_pair(spec, wl, machine))
    return list(priced.values())


def mimo_tutorial(machine) -> list[dict]:
    """Bridge's MIMO tutorial: the gain in tokens/s per GPU of 16 + 1 encoder GPU over 16, over the unknowns;
    then RDR's rows alone (its image size is published)."""
    return [row("Qwen3.5-VL 27B MIMO tutorial: heterogeneous vs homogeneous tokens/s per GPU", "%",
                [23.0, 44.7], mimo_gains(machine)),
            row("Qwen3.5-VL 27B MIMO tutorial, RDR (768x768 images): tokens/s per GPU gain", "%",
                [23.3, 44.7], mimo_gains(machine, (RDR_ENCODER_TOKENS,)))]


def row(name: str, unit: str, published, predicted) -> dict:
    """One figure: `predicted` a number, or the [low, high] range over the stated assumptions."""
    if isinstance(predicted, (list, tuple)):
        low, high = min(predicted), max(predicted)
        predicted = round(low, 3) if abs(high - low) < 1e-9 else [round(low, 3), round(high, 3)]
    else:
        predicted = round(predicted, 3)
    return {"name": name, "unit": unit, "published": published, "predicted": predicted}


def verdict(r: dict) -> str:
    """Whether the goal holds: absolute figures within +-25% over the whole range, a gain's sign right over the
    whole range and every point within 15 points of the published range ("partly": some of the range)."""
    pub, pred = r["published"], r["predicted"]
    lo, hi = (pred, pred) if not isinstance(pred, list) else pred
    if r["unit"] == "%":
        plo, phi = pub
        sign = lo > 0
        whole = lo >= plo - 15 and hi <= phi + 15  # every predicted point within 15 points of the published range
        some = hi >= plo - 15 and lo <= phi + 15
        if sign and whole:
            return "met (sign right)"
        return (f"partly (sign {'right' if sign else 'wrong'}; part of the range within 15 points)" if some
                else f"NOT met (sign {'right' if sign else 'wrong'})")
    ok = all(0.75 * pub <= v <= 1.25 * pub for v in (lo, hi))
    some = any(0.75 * pub <= v <= 1.25 * pub for v in (lo, hi))
    return "met" if ok else ("partly (part of the range)" if some else "NOT met")


def public_rows(machine=None) -> list[dict]:
    from ds_hetero.planner.machine import PROFILES

    machine = machine or PROFILES["h100"]
    return qwen36_card(machine) + gemma4_card(machine) + mimo_tutorial(machine)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--terms", action="store_true", help="print the Qwen3.6 card's breakdown, term by term")
    p.add_argument("--overlap-launches", action="store_true",
                   help="price kernel launches as overlapping device work (machine.py overlap_launches: the lower "
                        "bound of their cost; the default adds them, the upper bound)")
    args = p.parse_args(argv)
    from dataclasses import replace

    from ds_hetero.planner.machine import PROFILES

    machine = replace(PROFILES["h100"], overlap_launches=args.overlap_launches)
    if args.terms:
        print(qwen36_terms(machine))
        return 0
    rows = public_rows(machine)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'figure':<80} {'unit':<13} {'published':>14} {'predicted':>20}  goal")
    for r in rows:
        fmt = (lambda v: f"{v[0]:g} .. {v[1]:g}" if isinstance(v, list) else f"{v:g}")
        print(f"{r['name']:<80} {r['unit']:<13} {fmt(r['published']):>14} {fmt(r['predicted']):>20}  {verdict(r)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
