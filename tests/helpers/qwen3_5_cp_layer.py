"""The Gated DeltaNet layer on sequence shards against the unsharded layer, and its exchange pair's adjoint.

Run inside a 4-rank launch (every rank builds every group in the same order):
- `deltanet_on_shards(rank, world_size, tp, cp, ...)`: the tiny Qwen3.5's first Gated DeltaNet layer
  (fp64), sharded over tp by the family's plan and given the cp forward (families/qwen3_5/sequence_shards.py)
  over cp; every rank feeds its sequence chunk of the same batch (padded, or packed rows with
  `packed_segments`); the chunks' outputs, input gradients and the parameter gradients (summed over cp,
  gathered over tp) against the stock layer on the whole batch (padded: each sample's valid positions;
  packed: each sample run alone). `local=True` is the negative control: the stock forward on each chunk
  (the state restarts at every chunk boundary instead of crossing ranks).
- `exchange_adjoint(rank, world_size)`: `sequence_to_heads` and `heads_to_sequence` over cp 2 and cp 4:
  inverse of each other, and <A x, y> = <x, A^T y> with A^T the backward of each.
"""

from __future__ import annotations

import torch


def _groups(rank, tp, cp):
    """(tp group, cp group) of `rank` in a 4-rank world (tp fastest, then cp); every rank builds all."""
    import torch.distributed as dist

    tps = [dist.new_group(list(range(s, s + tp))) for s in range(0, 4, tp)]
    cps = [dist.new_group([d * tp * cp + t + c * tp for c in range(cp)]) for d in range(4 // (tp * cp))
           for t in range(tp)]
    tp_group = tps[rank // tp]
    cp_group = next(g for g in cps if rank in dist.get_process_group_ranks(g))
    return tp_group, cp_group


def deltanet_on_shards(rank, world_size, tp, cp, packed=False, local=False, length=72):
    import copy

    import torch.distributed as dist

    from ds_hetero.families.qwen3_5.plans import TP_PLANS
    from ds_hetero.families.qwen3_5.sequence_shards import apply_sequence_sharded_deltanet
    from ds_hetero.families.qwen3_5.packed_deltanet import segmented_forward
    from ds_hetero.tensor_parallel import gather_full
    from ds_hetero.tensor_parallel.shard_plans import apply_plans, validate_tensor_parallel
    from ds_hetero.toy import tiny_qwen3_5

    tp_group, cp_group = _groups(rank, tp, cp)
    full = tiny_qwen3_5(seed=3).model.language_model.layers[0].linear_attn.double()
    shard = copy.deepcopy(full)
    if tp > 1:
        apply_plans(validate_tensor_parallel(shard, tp, "language", plans=TP_PLANS), tp_group)
    if not local:
        apply_sequence_sharded_deltanet(shard, cp_group)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, length, full.hidden_size, generator=gen, dtype=torch.float64)
    g = torch.randn(2, length, full.hidden_size, generator=gen, dtype=torch.float64)
    segments = [[30, 0, 26, length - 56], [length - 7, 7]] if packed else None  # an empty one, and padding
    mask = torch.ones(2, length, dtype=torch.long)
    if not packed:
        mask[1, -9:] = 0  # right padding, as the language stage pads: positions after it are not compared
        g = g * mask[..., None]
    xi = x.clone().requires_grad_(True)
    if packed:
        y = segmented_forward(full, xi, packed_segments=segments)
    else:
        y = full(hidden_states=xi, attention_mask=mask)
    y.backward(g)
    want = (y.detach(), xi.grad, {n: p.grad for n, p in full.named_parameters()})
    c, n = dist.get_rank(cp_group), length // cp
    xs = x[:, c * n:(c + 1) * n].clone().requires_grad_(True)
    kw = {"packed_segments": segments} if packed and not local else {}
    ys = shard(hidden_states=xs, **kw)
    ys.backward(g[:, c * n:(c + 1) * n])
    grads = {}
    for name, p in shard.named_parameters():
        total = p.grad.clone()
        dist.all_reduce(total, group=cp_group)  # what DeepSpeed does over cp
        grads[name] = gather_full(total, p, tp_group) if tp > 1 else total
    keep = mask[:, c * n:(c + 1) * n].bool()
    err = lambda a, b: float((a - b).abs().max() / b.abs().max())  # noqa: E731
    return {"out": err(ys.detach()[keep], want[0][:, c * n:(c + 1) * n][keep]),
            "input_grad": err(xs.grad, want[1][:, c * n:(c + 1) * n]),
            "grads": {k: err(grads[k], want[2][k]) for k in want[2]}}


def exchange_adjoint(rank, world_size):
    import torch.distributed as dist

    from ds_hetero.families.qwen3_5.sequence_shards import heads_to_sequence, sequence_to_heads

    out = {}
    groups = {2: [dist.new_group([0, 1]), dist.new_group([2, 3])], 4: [dist.new_group([0, 1, 2, 3])]}
    for cp, made in groups.items():
        group = made[rank // cp] if cp == 2 else made[0]
        gen = torch.Generator().manual_seed(11 + rank)
        x = torch.randn(2, 3, cp, 5, generator=gen, dtype=torch.float64, requires_grad=True)
        y = torch.randn(2, 3 * cp, 5, generator=gen, dtype=torch.float64, requires_grad=True)
        ax = sequence_to_heads(x, group)
        aty = heads_to_sequence(y, group)
        inner = torch.stack([(ax * y).sum(), (x * aty).sum()]).detach()
        dist.all_reduce(inner)  # the inner products over every rank's part
        ax.backward(y)  # the backward of A applied to y: must be A^T y
        aty.backward(x)  # and of A^T applied to x: A x
        gx, gy, x = x.grad, y.grad, x.detach()
        roundtrip = heads_to_sequence(sequence_to_heads(x, group), group)
        out[cp] = {"adjoint": float((inner[0] - inner[1]).abs()), "inverse": float((roundtrip - x).abs().max()),
                   "backward_of_A": float((gx - aty.detach()).abs().max()),
                   "backward_of_AT": float((gy - ax.detach()).abs().max())}
    return out
