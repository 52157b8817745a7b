"""Qwen2.5-VL, Gemma 3, Qwen3-VL, InternVL and LLaVA-OneVision through HeteroEngine against the single-process Hugging Face model.

fp32, 5 steps of 2 micro-batches, clipping active: losses (the fused model's own
`model(**batch).loss`), global norms and every updated weight to relative 1e-5, on
colocated vision tp2 dp2 + language tp2 dp2, vision dp4 + language tp2 dp2 with `balance:
tokens`, and disaggregated vision dp2 (ranks 0-1) + language tp2 (ranks 2-3); batches with
several images per sample, one, and none; boundary bytes at the lower bound (for Qwen3-VL the
rows carry the merged embedding and both DeepStack levels: the bound of all of them). Per family, a
wrong reference (windows dropped / image blocks causal / DeepStack levels in the wrong
layers / pixel shuffle transposed / any-resolution tiles reversed) ends far away: the check can fail.
"""

import pytest

from ds_hetero.testing.launch import run_distributed
from tests.helpers.family_checks import CLIP, check_family_parity as _check
from tests.helpers.family_parity import train_family

pytestmark = pytest.mark.distributed


LAYOUTS = {
    "colocated vision tp2dp2 + language tp2dp2 zero1 adamw": dict(
        layout={"vision": {"tp": 2, "dp": 2}, "language": {"tp": 2, "dp": 2}}, zero_stage=1, wrong=True),
    "vision dp4 + language tp2dp2 balance tokens zero2 sgd": dict(
        layout={"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}, zero_stage=2, optimizer="sgd",
        hetero={"balance": "tokens"}),
    "disaggregated vision dp2 on 0-1 + language tp2 on 2-3 zero1 adamw": dict(
        layout={"vision": {"dp": 2, "ranks": [0, 1]}, "language": {"tp": 2, "dp": 1, "ranks": [2, 3]}},
        zero_stage=1, placement="disaggregated", micro_batches=4),
}


def _suite(rank, world_size, family):
    return {name: train_family(rank, world_size, family, steps=5, clip=CLIP, **kw) for name, kw in LAYOUTS.items()}


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3", "qwen3_vl", "internvl", "llava_onevision"])
def test_family_layouts_match_single_process_reference(family):
    _check(run_distributed(_suite, world_size=4, timeout=1200, family=family))
