"""Replicas start equal: ranks that build different initial weights train rank 0's model.

Every rank r builds its model as a script seeding `7 + r` would (ms-swift seeds `seed + rank`):
the whole model, or only freshly initialized PEFT LoRA adapters (B non-zero). Stock DeepSpeed
broadcasts rank 0's weights at initialize; ds_hetero broadcasts rank 0's parameters and buffers
before the split and the tp cut (ds_hetero/stages/equal_replicas.py). Against the single-process
Hugging Face reference of rank 0's model, at the parity bar (fp32, 3 steps, clipping active:
losses 1e-5 relative and equal to HF's own loss, norms 1e-4, every weight tensor 1e-5):
    whole model per rank, vision dp4 + language tp2 dp2, ZeRO 1
    LoRA adapters per rank, vision dp4 + language tp2 dp2, ZeRO 1
    whole model per rank, disaggregated vision dp2 (ranks 0-1) + language tp2 (ranks 2-3)
    whole tied model per rank, first_stage vision dp2 + language pp2 dp2
    whole model per rank, ZeRO 3 on both stages
Negative control: the same per-rank models without the equalization train something else
(losses beyond the tolerance, every rank's weights far from rank 0's model's). Pure: the broadcast's bucketing keeps every dtype's bytes.
"""

import pytest
import torch

from ds_hetero.testing.cases import launch_cases
from tests.helpers.equal_replicas import add_lora, reseed_lora, reseed_whole, run
from tests.helpers.parity_checks import check_parity

V4_L22 = {"vision": {"dp": 4}, "language": {"tp": 2, "dp": 2}}
CONTROL = "control: whole model per rank, not equalized"
TIED = dict(tie_word_embeddings=True)


def _suite(rank, world_size):
    return run(rank, world_size, {
        "whole model per rank, vision dp4 + language tp2dp2 zero1": dict(
            layout=V4_L22, zero_stage=1, rank_model=reseed_whole("llava")),
        "lora adapters per rank, vision dp4 + language tp2dp2 zero1": dict(
            layout=V4_L22, zero_stage=1, prepare=add_lora, rank_model=reseed_lora),
        "whole model per rank, disaggregated vision dp2 + language tp2": dict(
            layout={"vision": {"dp": 2}, "language": {"tp": 2, "dp": 1}}, zero_stage=1,
            placement="disaggregated", rank_model=reseed_whole("llava")),
        "tied model per rank, first_stage vision dp2 + language pp2dp2": dict(
            layout={"vision": {"dp": 2}, "language": {"dp": 2, "pp": 2}}, zero_stage=1, placement="first_stage",
            model_kw=TIED, rank_model=reseed_whole("llava", TIED)),
        "whole model per rank, zero 3 vision dp4 + language tp2dp2 sgd": dict(
            layout=V4_L22, zero_stage=3, optimizer="sgd", rank_model=reseed_whole("llava")),
        CONTROL: dict(layout=V4_L22, zero_stage=1, rank_model=reseed_whole("llava"), equalize=False),
    })


@pytest.fixture(scope="module")
def launched():
    return launch_cases({"suite": (_suite, {})}, world_size=4, timeout=1800)["suite"]


@pytest.mark.distributed
def test_per_rank_weights_train_rank0_model(launched):
    check_parity([{n: r for n, r in per_rank.items() if n != CONTROL} for per_rank in launched])


@pytest.mark.distributed
def test_without_equalization_another_model_trains(launched):
    """The negative control: the per-rank models really differ, and unequalized they train something else."""
    worst = max(abs(got - want) / abs(want) for per_rank in launched
                for got, want in zip(per_rank[CONTROL]["losses"], per_rank[CONTROL]["ref_losses"]))
    assert worst > 1e-5, worst  # the parity bar's loss tolerance fails
    for per_rank in launched:  # and every rank ends with weights far from rank 0's model's
        rel, where, abs_, compared = per_rank[CONTROL]["weight_err"]
        assert compared > 0 and rel > 100 * 1e-5 and abs_ > 100 * 1e-6, per_rank[CONTROL]["weight_err"]


def test_broadcast_buckets_keep_every_dtype(monkeypatch):
    """One process, the broadcast a no-op: each tensor's bytes go through the padded bucket and come
    back bit-identical, for mixed dtypes and sizes across several buckets."""
    import ds_hetero.stages.equal_replicas as eq

    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.randn(7, 3))
            self.b = torch.nn.Parameter(torch.randn(5).to(torch.bfloat16))
            self.register_buffer("ids", torch.arange(11))
            self.register_buffer("mask", torch.rand(13) > 0.5)
            self.register_buffer("empty", torch.zeros(0))

    torch.manual_seed(0)
    src, dst = Mixed(), Mixed()
    sent = []  # the buckets as the source filled them, replayed at the receiver
    monkeypatch.setattr(eq, "BUCKET_BYTES", 48)  # several buckets
    monkeypatch.setattr(eq.dist, "broadcast", lambda flat, source, group=None: sent.append(flat.clone()))
    monkeypatch.setattr(eq.dist, "get_rank", lambda: 0)
    assert eq.equalize_replicas(src, None, 0, "cpu") == []  # the source sends and keeps its own
    assert len(sent) > 2
    replay = iter(sent)
    monkeypatch.setattr(eq.dist, "broadcast", lambda flat, source, group=None: flat.copy_(next(replay)))
    monkeypatch.setattr(eq.dist, "get_rank", lambda: 1)
    differed = eq.equalize_replicas(dst, None, 0, "cpu")
    assert differed == ["a", "b", "mask"]  # arange is the same on both ranks
    assert [n for n, _ in eq.state_tensors(src)] == ["a", "b", "ids", "mask"]  # the empty buffer skipped
    for (name, t), (_, u) in zip(eq.state_tensors(src), eq.state_tensors(dst)):
        assert t.dtype == u.dtype and torch.equal(t, u), name
