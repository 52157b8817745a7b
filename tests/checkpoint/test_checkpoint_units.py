"""Pure pieces of ds_hetero/checkpoint (no processes): tp merge and re-split, layout comparison,
the kill-point hook's parsing."""

import pytest
import torch

from ds_hetero.checkpoint.manifest import describe_layout, same_layout
from ds_hetero.checkpoint.publish import kill_point
from ds_hetero.checkpoint.reshard import split_full
from ds_hetero.tensor_parallel.layers import mark_sharded, merge_shards, shard_tensor


@pytest.mark.parametrize("dim,stride,tp", [(0, 1, 2), (1, 1, 4), (0, 3, 2), (0, 3, 4)])
def test_merge_undoes_the_layers_split(dim, stride, tp):
    """Fused q|k|v (stride 3, Qwen2-VL's vision qkv) and plain column / row shards round-trip exactly."""
    full = torch.randn(24, 16) if dim == 0 else torch.randn(16, 24)
    pieces = [shard_tensor(full, dim, r, tp, stride) for r in range(tp)]
    assert torch.equal(merge_shards(pieces, dim, stride, full.shape[dim]), full)
    if stride > 1:  # negative control: merging as if unstrided scrambles q, k and v
        assert not torch.equal(merge_shards(pieces, dim, 1, full.shape[dim]), full)


def test_split_full_pads_the_vocabulary_like_the_head():
    """A head padded from vocabulary 10 to 12 for tp 4: the re-split adds the same zero rows."""
    full = torch.randn(10, 8)
    tp = 4
    padded = torch.cat([full, torch.zeros(2, 8)])
    for rank in range(tp):
        param = mark_sharded(torch.nn.Parameter(torch.empty(3, 8)), 0, 1, 10)
        assert torch.equal(split_full(full, param, rank, tp), shard_tensor(padded, 0, rank, tp))
    shards = [shard_tensor(padded, 0, r, tp) for r in range(tp)]
    assert torch.equal(merge_shards(shards, 0, 1, 10), full)
    replicated = torch.nn.Parameter(torch.empty(10, 8))
    assert split_full(full, replicated, 1, tp) is full


def _facts(**over):
    facts = {"placement": "colocated", "world_size": 4, "zero_stage": 1, "dtype": "float32",
             "stages": {"vision": {"tp": 1, "cp": 1, "dp": 4, "ranks": [0, 1, 2, 3], "sequence_parallel": False},
                        "language": {"tp": 2, "cp": 1, "dp": 2, "ranks": [0, 1, 2, 3], "sequence_parallel": False}}}
    facts.update(over)
    return facts


def test_same_layout_and_descriptions():
    assert same_layout(_facts(), _facts())
    assert not same_layout(_facts(), _facts(zero_stage=2))
    assert not same_layout(_facts(), _facts(dtype="bfloat16"))
    other = _facts()
    other["stages"] = dict(other["stages"], language={**other["stages"]["language"], "tp": 1, "dp": 4})
    assert not same_layout(_facts(), other)
    assert describe_layout(_facts(), "language") == "tp2 cp1 dp2 ranks [0, 1, 2, 3], colocated, ZeRO 1, float32"
    assert describe_layout(_facts(), "audio") == "absent"


def test_kill_point_names_are_checked(monkeypatch):
    monkeypatch.setenv("DS_HETERO_CHECKPOINT_KILL", "typo:0")
    with pytest.raises(ValueError, match="unknown point 'typo'"):
        kill_point("begin", 0)
    monkeypatch.setenv("DS_HETERO_CHECKPOINT_KILL", "begin:1")
    kill_point("begin", 0)  # another rank: nothing happens
    kill_point("rank_written", 1)  # another point: nothing happens


def _moe_config(language, zero):
    from ds_hetero.config import load_config

    return load_config({"train_batch_size": 8, "zero_optimization": {"stage": zero},
                        "hetero_parallel": {"placement": "colocated", "micro_batches": 1,
                                            "stages": {"vision": {"dp": 4}, "language": language}}}, world_size=4)


def test_ep_checkpoints_refuse_what_is_not_built():
    """ZeRO 3 or a pipeline with ep > 1: a CheckpointError naming them (the layout is the config's:
    every rank raises alike, before anything is written or read). Disaggregated placement is built
    (tests/helpers/moe_checkpoints.py `disaggregated_chain`)."""
    from types import SimpleNamespace

    from ds_hetero.checkpoint import CheckpointError
    from ds_hetero.checkpoint.store import _refuse_expert_parallel

    _refuse_expert_parallel(SimpleNamespace(config=_moe_config({"tp": 2, "dp": 2, "ep": 2}, zero=2)))
    with pytest.raises(CheckpointError, match="ep = 2 with ZeRO stage 3 are not built yet") as info:
        _refuse_expert_parallel(SimpleNamespace(config=_moe_config({"dp": 4, "ep": 2}, zero=3)))
    assert "save_pretrained" in str(info.value)
    with pytest.raises(CheckpointError, match="ep = 2 with pp = 2 are not built yet"):
        _refuse_expert_parallel(SimpleNamespace(config=_moe_config({"dp": 2, "pp": 2, "ep": 2}, zero=1)))


def test_expert_blocks_are_the_slices_peft_reads_and_merge_back():
    """expert_parallel/gather.py: A [E r, in] and B [out, r E] as PEFT reads them ((E, r, in), (out, r, E));
    ep rank s's block is experts [s E/ep, (s+1) E/ep) of both, and the blocks merge back. Negative control:
    B cut as if each expert's columns were contiguous (outer 1) is not those experts' columns."""
    import torch

    from ds_hetero.expert_parallel.gather import expert_block, merge_expert_blocks

    E, r, ep, d = 8, 3, 4, 5
    a, b = torch.randn(E * r, d), torch.randn(d, r * E)
    local = E // ep
    for s in range(ep):
        mine = slice(s * local, (s + 1) * local)
        assert torch.equal(expert_block(a, 0, 1, s, ep).reshape(local, r, d), a.reshape(E, r, d)[mine])
        assert torch.equal(expert_block(b, 1, r, s, ep).reshape(d, r, local), b.reshape(d, r, E)[:, :, mine])
    assert torch.equal(merge_expert_blocks([expert_block(b, 1, r, s, ep) for s in range(ep)], 1, r), b)
    assert torch.equal(merge_expert_blocks([expert_block(a, 0, 1, s, ep) for s in range(ep)], 0, 1), a)
    assert not torch.equal(expert_block(b, 1, 1, 1, ep).reshape(d, r, local), b.reshape(d, r, E)[:, :, local:2 * local])
