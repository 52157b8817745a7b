"""bench_balance.py --video: the encoder's straggler on a mix of video clips and images, from the step plan
alone (no processes, no weights: the plans are pure functions of the samples' token ids).

    .venv/bin/python benchmarks/bench_balance.py --video

A global batch of 16: clips of 4-64 frames (448 x 448 px, 2 frames a temporal patch) beside still
images of 448-1344 px a side and text-only samples, vision dp 4, 2 encoder passes. Per family
(real-size vision configs, Qwen2.5-VL-7B's and Qwen3-VL-8B's towers) and balance: the vision stage's
max / mean cost per rank (worst pass) by the encoder's true work (each frame attends within itself;
Qwen2.5-VL's windows), and the max / mean image tokens. Qwen2.5-VL places a clip whole (one placeholder
run: the plan prices its frames at the bounded frame size, families/qwen2_vl/adapter.py FRAME_TOKENS);
Qwen3-VL spreads a clip's frames over the ranks (one run per temporal patch).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch

FRAMES = (4, 8, 16, 32, 64)
SIDES = (448, 672, 896, 1344)


def _adapter(family: str):
    """The family's adapter over its real-size config (no weights: the plan reads the config only)."""
    from ds_hetero.families.qwen2_5_vl.adapter import Qwen2_5_VLAdapter
    from ds_hetero.families.qwen3_vl.adapter import Qwen3VLAdapter
    from ds_hetero.families.qwen2_vl.tiny import QWEN_SPECIAL_IDS
    from transformers import Qwen2_5_VLConfig, Qwen3VLConfig

    if family == "qwen2.5-vl":
        cfg = Qwen2_5_VLConfig(vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, patch_size=14,
                                                  window_size=112, fullatt_block_indexes=[7, 15, 23, 31]),
                               **QWEN_SPECIAL_IDS)
        return Qwen2_5_VLAdapter(SimpleNamespace(config=cfg)), 14
    cfg = Qwen3VLConfig(vision_config=dict(depth=27, hidden_size=1152, intermediate_size=4304, patch_size=16),
                        **QWEN_SPECIAL_IDS)
    return Qwen3VLAdapter(SimpleNamespace(config=cfg)), 16


def mix(adapter, patch: int, n: int = 16, seed: int = 0):
    """Light samples (token ids only) and each sample's true per-item work: (samples, true costs)."""
    rng = random.Random(seed)
    m = adapter.merge
    samples, truths = [], []
    for i in range(n):
        ids, truth = [5, 6], []
        kind = ("video", "image", "video", "text")[i % 4]
        if kind == "video":
            t = rng.choice(FRAMES) // 2  # temporal patches
            side = 448 // patch
            frame = side * side // m**2  # rows of one temporal patch
            runs = [frame] * t if adapter.FRAME_RUNS else [frame * t]
            for r in runs:
                ids += [7, 7] + [adapter.video_token_id] * r + [8]  # timestamp text, run, end
            truth += [adapter.attention_cost(r, side * side) for r in runs]
        elif kind == "image":
            side = rng.choice(SIDES) // patch // m * m
            rows = side * side // m**2
            ids += [adapter.image_token_id] * rows + [8]
            truth.append(adapter.image_cost(rows))
        samples.append({"input_ids": torch.tensor(ids + [9]), "light": True})
        truths.append(truth)
    return samples, truths


def video_table(dp: int = 4, passes: int = 2):
    from ds_hetero.config import load_config
    from ds_hetero.step.balance import encoder_assignment

    print(f"\nvideo mix: 16 samples (clips of {'/'.join(map(str, FRAMES))} frames at 448 px, images "
          f"{'-'.join(map(str, (SIDES[0], SIDES[-1])))} px, text), vision dp {dp}, {passes} encoder passes")
    print("family      balance   true cost max/mean   tokens max/mean   items")
    out = {}
    for family in ("qwen2.5-vl", "qwen3-vl"):
        adapter, patch = _adapter(family)
        samples, truths = mix(adapter, patch)
        for balance in ("position", "tokens"):
            cfg = load_config({"train_batch_size": 16, "hetero_parallel": {
                "micro_batches": passes, "balance": balance,
                "stages": {"vision": {"dp": dp}, "language": {"dp": dp}}}}, dp)
            worst_cost, worst_tok, items = 0.0, 0.0, 0
            for p in range(passes):
                plan = encoder_assignment(cfg, adapter, samples, "vision", p)
                cost, tok = [0] * dp, [0] * dp
                for image, rank in zip(plan.images, plan.rank):
                    cost[rank] += truths[image.sample][image.index]
                    tok[rank] += image.rows
                items += len(plan.images)
                worst_cost = max(worst_cost, max(cost) / (sum(cost) / dp))
                worst_tok = max(worst_tok, max(tok) / (sum(tok) / dp))
            out[family, balance] = (worst_cost, worst_tok)
            print(f"{family:<11} {balance:<9} {worst_cost:>18.2f}   {worst_tok:>15.2f}   {items}")
    return out
