"""Pure pieces of ds_hetero/checkpoint (no processes): tp merge and re-split, layout comparison,
the kill-point hook's parsing, which stages a layout change moves under ZeRO 3, a ZeRO 3 partition."""

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


def test_a_layout_change_moves_zero3_only_for_an_ep_stage():
    """ZeRO 3 in DeepSpeed's own files (no ep) stays with the layout that saved it; a stage with experts
    over ep, whose files are ds_hetero's own, moves under ZeRO 3 on either side
    (tests/helpers/moe_checkpoints.py `zero3_chain` runs it). Negative control: the same stage without ep
    is refused, saved or loaded at ZeRO 3."""
    from ds_hetero.checkpoint.store import zero3_not_resharded

    def facts(**language):
        return {"zero_stage": 1, "stages": {"vision": {"zero_stage": 1}, "language": language}}

    assert zero3_not_resharded(facts(zero_stage=3, ep=2), facts(zero_stage=1, ep=2)) == []
    assert zero3_not_resharded(facts(zero_stage=1, ep=2), facts(zero_stage=3, ep=4)) == []
    assert zero3_not_resharded(facts(zero_stage=3, ep=2), facts(zero_stage=3, ep=1)) == ["language"]
    assert zero3_not_resharded(facts(zero_stage=3), facts(zero_stage=1)) == ["language"]
    assert zero3_not_resharded(facts(zero_stage=1), facts(zero_stage=1)) == []


def test_a_zero3_partition_is_the_padded_slice_of_its_rank(monkeypatch):
    """zero3_state.py: rank r's partition of a tensor its group does not divide (7 elements over 2 ranks,
    partitions of 4) is elements [4 r, 4 r + 4) of it zero-padded to 8 (DeepSpeed's own setter narrows
    the unpadded tensor there: out of range on the last rank)."""
    from ds_hetero.checkpoint import zero3_state

    full = torch.arange(7.0).reshape(7, 1)
    for rank, want in ((0, [0.0, 1, 2, 3]), (1, [4.0, 5, 6, 0])):
        monkeypatch.setattr(zero3_state.dist, "get_rank", lambda group=None, rank=rank: rank)
        monkeypatch.setattr(zero3_state.dist, "get_world_size", lambda group=None: 2)
        assert zero3_state._partition(full, None, 4).tolist() == want


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
