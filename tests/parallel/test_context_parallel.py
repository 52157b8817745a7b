"""Sequence shards of the language stage: the batch cut (pure), the config errors, and the
attention over shards against full-sequence attention (values, gradients, adjoint of the all-to-all)."""

import pytest
import torch

from ds_hetero.context_parallel import full_attention_mask, padded_lengths, shard_input_ids, shard_language_batch
from ds_hetero.errors import HeteroConfigError
from ds_hetero.layout import StageLayout
from ds_hetero.loss import shifted_labels
from ds_hetero.testing.launch import run_distributed


def _layout(tp, cp, sp):
    return StageLayout("language", tp, cp, 1, tuple(range(tp * cp)), sequence_parallel=sp)


@pytest.mark.parametrize("tp,cp,sp", [(1, 2, False), (2, 2, False), (2, 2, True), (2, 1, True), (1, 4, False)])
def test_shards_cover_the_full_sequence_with_global_positions_and_labels(tp, cp, sp):
    layout = _layout(tp, cp, sp)
    b, s = 2, 16
    ids = torch.arange(b * s).reshape(b, s)
    labels = ids.clone()
    labels[:, :3] = -100
    mask = torch.ones(b, s, dtype=torch.long)
    mask[1, 12:] = 0
    batch = {"input_ids": ids, "labels": labels, "attention_mask": mask, "position_ids": None}
    shards = [shard_language_batch(batch, layout, r) for r in range(tp * cp)]
    # input ids: every rank its cp chunk (under sp the vocab-parallel embedding scatters the rows
    # onto the tp sub-chunks); shard_input_ids gives the sub-chunk c * tp + t, in rank order
    order = sorted(range(tp * cp), key=lambda r: (layout.coord(r).cp, layout.coord(r).tp))
    cp_heads = [r for r in order if layout.coord(r).tp == 0]
    assert torch.equal(torch.cat([shards[r]["input_ids"] for r in cp_heads], -1), ids)
    for r in order:
        assert torch.equal(shards[r]["input_ids"], shards[cp_heads[layout.coord(r).cp]]["input_ids"])
    if sp:
        assert torch.equal(torch.cat([shard_input_ids(ids, layout, r) for r in order], -1), ids)
    # labels: shifted on the full sequence, then cut by cp chunk (the last token of a chunk predicts the next chunk's first)
    assert torch.equal(torch.cat([shards[r]["labels"] for r in cp_heads], -1), shifted_labels(labels))
    assert torch.equal(torch.cat([shards[r]["position_ids"] for r in cp_heads], -1), torch.arange(s).expand(b, s))
    for r in range(tp * cp):
        assert torch.equal(shards[r]["attention_mask"], full_attention_mask(mask))


def test_full_mask_is_causal_and_hides_padding_keys():
    mask = torch.tensor([[1, 1, 1, 0]])
    full = full_attention_mask(mask)[0, 0]
    want = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
    assert torch.equal(full, want)


def test_sequence_must_be_padded_to_the_shard_count():
    batch = {"input_ids": torch.zeros(1, 6, dtype=torch.long), "labels": torch.zeros(1, 6, dtype=torch.long),
             "attention_mask": torch.ones(1, 6), "position_ids": None}
    with pytest.raises(HeteroConfigError, match="not divisible"):
        shard_language_batch(batch, _layout(1, 4, False), 0)


def test_padded_lengths_follow_each_dp_replica():
    samples = [{"input_ids": torch.zeros(n)} for n in (5, 9, 3, 4)]
    assert padded_lengths(samples, [0, 0, 1, 1], _layout(2, 2, True)) == [12, 12, 4, 4]


def test_heads_not_divisible_by_tp_times_cp_names_the_field_and_the_sizes_that_work():
    from ds_hetero.config import load_config
    from ds_hetero.families import adapter_for
    from ds_hetero.toy import tiny_llava

    cfg = load_config({"train_batch_size": 8, "hetero_parallel": {"stages": {
        "vision": {"dp": 8}, "language": {"tp": 2, "cp": 4, "dp": 1}}}}, 8)
    with pytest.raises(HeteroConfigError) as exc:
        adapter_for(tiny_llava("clip")).check_layouts(cfg)
    msg = str(exc.value)
    assert "hetero_parallel.stages.language.cp" in msg and "4 attention heads" in msg and "[1, 2]" in msg, msg


@pytest.mark.parametrize("language", [{"cp": 2, "dp": 2}, {"tp": 2, "cp": 2, "dp": 1, "sequence_parallel": True}])
def test_zero3_with_cp_refuses_reduce_scatter_off_with_the_field(language):
    # ZeRO 3 with sequence shards runs (context_parallel/zero3.py) on DeepSpeed's reduce-scatter path only
    from ds_hetero.config import load_config
    from ds_hetero.validation import check_engine_support

    cfg = load_config({"train_batch_size": 8, "zero_optimization": {"stage": 3, "reduce_scatter": False},
                       "optimizer": {"type": "SGD"},
                       "hetero_parallel": {"stages": {"vision": {"dp": 4}, "language": language}}}, 4)
    with pytest.raises(HeteroConfigError, match="zero_optimization.reduce_scatter.*ZeRO stage 3"):
        check_engine_support(cfg)


# ---------------------------------------------------------------------------- distributed
def _decoder(kv_heads, seed=3):
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64,
                      attn_implementation="sdpa")
    torch.manual_seed(seed)
    return LlamaModel(cfg)


def _attention_suite(rank, world_size):
    """cp = world_size: sharded decoder vs the full one (outputs, input and weight gradients), and the adjoint."""
    import copy

    import torch.distributed as dist
    from deepspeed.sequence.layer import _SeqAllToAll

    from ds_hetero.context_parallel import apply_sequence_sharded_attention

    group = dist.new_group(list(range(world_size)))
    out = {}
    b, s, h = 2, 8 * world_size, 32
    for kv in (2, 1):  # kv 1 < cp: heads repeated before the all-to-all
        full = _decoder(kv)
        sharded = copy.deepcopy(full)
        assert apply_sequence_sharded_attention(sharded, group) == 2
        torch.manual_seed(11)
        x = torch.randn(b, s, h)
        mask = torch.ones(b, s, dtype=torch.long)
        mask[1, s - 5:] = 0  # right padding in the second sample
        dy = torch.randn(b, s, h)
        valid = mask.bool()[..., None]  # padded rows: no loss flows from them in training

        xf = x.clone().requires_grad_()
        yf = full(inputs_embeds=xf, attention_mask=mask).last_hidden_state
        (yf * dy * valid).sum().backward()

        chunk = s // world_size
        lo, hi = rank * chunk, (rank + 1) * chunk
        xs = x[:, lo:hi].clone().requires_grad_()
        pos = torch.arange(s).expand(b, s)[:, lo:hi]
        ys = sharded(inputs_embeds=xs, attention_mask=full_attention_mask(mask), position_ids=pos).last_hidden_state
        (ys * dy[:, lo:hi] * valid[:, lo:hi]).sum().backward()
        grads = {n: p.grad.clone() for n, p in sharded.named_parameters() if p.grad is not None}
        assert len(grads) > 10  # the comparison below covers every layer
        for g in grads.values():  # the partial weight gradients of the shards sum to the full one
            dist.all_reduce(g, group=group)
        real = valid[:, lo:hi]
        out[f"kv{kv}"] = {
            "out": ((ys - yf[:, lo:hi]) * real).abs().max().item(),
            "dx": (xs.grad - xf.grad[:, lo:hi]).abs().max().item(),
            "dw": max((grads[n] - p.grad).abs().max().item() / p.grad.abs().max().item()
                      for n, p in full.named_parameters() if p.grad is not None),
        }
        # negative control: local positions (0..chunk-1 on every shard) change the output
        ybad = sharded(inputs_embeds=xs.detach(), attention_mask=full_attention_mask(mask),
                       position_ids=pos - lo).last_hidden_state
        out[f"kv{kv} local positions"] = ((ybad - yf[:, lo:hi]) * real).abs().max().item()

    # adjoint of the Ulysses all-to-all as used ([b, s, h, d], scatter heads, gather sequence)
    torch.manual_seed(100 + rank)
    xa = torch.randn(2, 4, 4 * world_size, 3, dtype=torch.float64, requires_grad=True)
    ya = torch.randn(2, 4 * world_size, 4, 3, dtype=torch.float64)
    ax = _SeqAllToAll.apply(group, xa, 2, 1, 0, None, None, None, True, None)
    (aty,) = torch.autograd.grad(ax, xa, ya)
    lhs = torch.tensor([(ax.detach() * ya).sum().item(), (xa.detach() * aty).sum().item()], dtype=torch.float64)
    dist.all_reduce(lhs, group=group)
    out["adjoint"] = (lhs[0].item(), lhs[1].item())
    return out


def test_attention_over_shards_matches_full_sequence_attention():
    results = run_distributed(_attention_suite, world_size=2, timeout=300)
    for r in results:
        for kv in ("kv2", "kv1"):
            assert r[kv]["out"] < 1e-5 and r[kv]["dx"] < 1e-5 and r[kv]["dw"] < 1e-5, r
        a, b = r["adjoint"]
        assert abs(a - b) <= 1e-10 * max(1.0, abs(a)), r["adjoint"]
    for kv in ("kv2", "kv1"):  # negative control: local positions fail the check (on rank 1, whose shard starts at 8)
        assert max(r[f"{kv} local positions"] for r in results) > 10 * 1e-5, results


def test_validate_shows_the_cp_coordinate_of_every_rank(capsys):
    from pathlib import Path

    from ds_hetero.cli import main

    config = Path(__file__).resolve().parents[2] / "ds_configs/llava_long_context.json"
    assert main(["validate", str(config), "--world-size", "4"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line[:1].isdigit()]
    # language tp2 cp2 dp1: tp fastest, then cp
    assert rows == [["0", "0,0,0", "0,0,0"], ["1", "0,0,1", "1,0,0"], ["2", "0,0,2", "0,1,0"], ["3", "0,0,3", "1,1,0"]]


def test_kernels_without_a_dense_mask_are_refused_on_sequence_shards():
    from ds_hetero.context_parallel import check_context_parallel
    from ds_hetero.toy import tiny_llava

    text = tiny_llava("clip").config.text_config
    check_context_parallel(text, 2, 2)  # sdpa: fine
    text._attn_implementation = "flash_attention_2"
    with pytest.raises(HeteroConfigError, match="flash_attention_2"):
        check_context_parallel(text, 2, 2)
    check_context_parallel(text, 2, 1, sharded=False)  # unsharded language stage: any kernel
