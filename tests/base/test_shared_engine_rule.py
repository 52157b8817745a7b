"""Which configs make the stages share one engine (stages/shared_engine.py sharing_stages): a pure
function of the config and of which parameters train, the same on every rank."""

import pytest

from ds_hetero.config import load_config
from ds_hetero.stages.shared_engine import shared_ds_config, sharing_stages

SAME = {"vision": {"tp": 2, "dp": 2}, "language": {"tp": 2, "dp": 2}}
TRAINS = {"vision": [object()], "language": [object()]}


def _cfg(stages=SAME, zero=1, placement="colocated", zero_keys=None, **ds):
    return load_config({"train_batch_size": 8, "zero_optimization": {"stage": zero, **(zero_keys or {})},
                        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, **ds,
                        "hetero_parallel": {"placement": placement, "micro_batches": 2, "stages": stages}}, 4)


def _shared(cfg, trains=TRAINS, held=("vision", "language"), experts=False):
    return sharing_stages(cfg, trains, list(held), has_experts=experts)


def test_same_ranks_and_layout_at_zero_0_or_1_share_one_engine():
    assert _shared(_cfg()) == ("vision", "language")
    assert _shared(_cfg({"vision": {"dp": 4}, "language": {"dp": 4}}, zero=0)) == ("vision", "language")
    # an encoder's own passes change its batch keys only: still one engine
    assert _shared(_cfg({"vision": {"tp": 2, "dp": 2, "micro_batches": 1}, "language": {"tp": 2, "dp": 2}})) \
        == ("vision", "language")


@pytest.mark.parametrize("why, cfg_kw, shared_kw", [
    ("another layout", dict(stages={"vision": {"dp": 4}, "language": {"tp": 2, "dp": 2}}), {}),
    ("other ranks", dict(stages={"vision": {"dp": 2, "ranks": [0, 1]}, "language": {"dp": 2, "ranks": [2, 3]}},
                         placement="disaggregated"), {}),
    ("ZeRO 2", dict(zero=2), {}),
    ("ZeRO 3", dict(zero=3), {}),
    ("stages at different ZeRO stages", dict(stages={"vision": {"tp": 2, "dp": 2, "zero_stage": 0},
                                                     "language": {"tp": 2, "dp": 2}}), {}),
    ("overlap_comm", dict(zero_keys={"overlap_comm": True}), {}),
    ("optimizer offload", dict(zero_keys={"offload_optimizer": {"device": "cpu"}}), {}),
    ("bf16 at ZeRO 0", dict(zero=0, bf16={"enabled": True}), {}),
    ("a gradient accumulation dtype", dict(bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"}), {}),
    ("a frozen stage", {}, dict(trains={"vision": [], "language": [object()]})),
    ("experts", {}, dict(experts=True)),
    ("a stage this rank does not hold", {}, dict(held=("language",))),
])
def test_anything_else_keeps_one_engine_per_stage(why, cfg_kw, shared_kw):
    assert _shared(_cfg(**cfg_kw), **shared_kw) == (), why


def test_bf16_at_zero_1_shares():
    assert _shared(_cfg(bf16={"enabled": True})) == ("vision", "language")


def test_the_shared_config_takes_one_accumulation_step_of_the_ranks_whole_share():
    ds = shared_ds_config(_cfg(), ("vision", "language"))
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) \
        == (4, 1, 8)
    assert ds["gradient_clipping"] == 0.0 and "hetero_parallel" not in ds
