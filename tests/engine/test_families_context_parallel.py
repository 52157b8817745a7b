"""The new families on sequence shards: language cp2 (Ulysses) against the single-process model.

Qwen2.5-VL (M-RoPE positions of the full sequence, sliced), Qwen3-VL (DeepStack levels added on
each shard to the shard's own image rows), InternVL and LLaVA-OneVision (Qwen2 decoders): vision
dp4 + language tp1 cp2 dp2, and vision tp2 dp2 + language tp2 cp2 with sequence parallelism,
5 steps, the same bar as tests/engine/test_families_parity.py. (Gemma 3 refuses sequence shards:
tests/families/test_models_families.py.)
"""

import pytest

from ds_hetero.testing.launch import run_distributed
from tests.helpers.family_parity import train_family
from tests.helpers.family_checks import CLIP, check_family_parity as _check

pytestmark = pytest.mark.distributed

LAYOUTS = {
    "vision dp4 + language cp2 dp2 zero1 adamw": dict(
        layout={"vision": {"tp": 1, "dp": 4}, "language": {"tp": 1, "cp": 2, "dp": 2}}, zero_stage=1),
    "vision tp2 dp2 + language tp2 cp2 sequence parallel zero2 sgd": dict(
        layout={"vision": {"tp": 2, "dp": 2}, "language": {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}},
        zero_stage=2, optimizer="sgd"),
}


def _suite(rank, world_size, families):
    return {f"{family}: {name}": train_family(rank, world_size, family, steps=5, clip=CLIP, **kw)
            for family in families for name, kw in LAYOUTS.items()}


def test_families_on_sequence_shards_match_single_process_reference():
    _check(run_distributed(_suite, world_size=4, timeout=1500,
                           families=("qwen2_5_vl", "qwen3_vl", "internvl", "llava_onevision")))
