"""Benchmark the boundary exchange: BoundaryCommunicator against two baselines, in one run.

    .venv/bin/python benchmarks/bench_boundary.py [--iters 20] [--hidden 1024] [--backend nccl --max-world N]

For each layout pair (colocated and disaggregated), every rank moves the vision stage's image-
token rows [T, H] into the language stage's layout (forward exchange only) three ways:

  ours        BoundaryCommunicator: one uneven all_to_all_single, plus its consensus all-reduce
              (the "no check" column: validate=False, the all-to-all alone)
  leader      Megatron-LM MIMO bridge: the first rank of each vision dp replica sends its rows for
              each language dp replica to that replica's first rank (point-to-point; sizes are
              known on every rank, so no shape exchange), which broadcasts the whole tensor to
              its tp x cp group; each rank then keeps the rows of its sequence shard
  allgather   every rank's boundary rows, padded to the largest, all-gathered to every rank

Bytes are what crosses the network (local copies are free): for the broadcast, the full tensor
once per non-root member; for the all-gather, (N - 1) blocks into each of the N ranks. The
lower bound is every row a destination rank needs and does not hold, once per needing rank.
The backward columns are ours alone (one gradient exchange, bytes only): gradient rows sent,
completion among source replicas included, against the backward lower bound (every row
gradient a source replica needs and holds no destination copy of, once per replica).
Time is the median over iterations of the slowest rank's time per exchange. All three outputs
are checked equal on every rank. Runs on CPU with gloo, or with `--backend nccl` on GPUs, one
process per device (`--max-world N`: only the layout pairs that fit on N devices).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ds_hetero import StageLayout  # noqa: E402
from ds_hetero.boundary import BoundaryCommunicator, BoundaryInputs  # noqa: E402
from ds_hetero.testing.launch import run_distributed  # noqa: E402
from ds_hetero.topology.groups import build_groups  # noqa: E402

# torch 2.13 renamed all_gather_into_tensor; older torch only has the old name.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

SEQ_LEN = 2048
IMAGE_TOKENS = (0, 64, 144, 256, 576)  # per sample: none, or one image at a few resolutions


def L(name, tp, cp, dp, ranks, sp=False):
    return StageLayout(name, tp, cp, dp, tuple(ranks), sequence_parallel=sp)


# (label, vision layout, language layout, placement); grouped by world size, one launch each.
CASES = {
    4: [
        ("v tp2dp2 -> l tp2dp2", L("vision", 2, 1, 2, range(4)), L("language", 2, 1, 2, range(4)), "colocated"),
        ("v tp4dp1 -> l tp2dp2", L("vision", 4, 1, 1, range(4)), L("language", 2, 1, 2, range(4)), "colocated"),
        ("v tp1dp4 -> l tp2dp2", L("vision", 1, 1, 4, range(4)), L("language", 2, 1, 2, range(4)), "colocated"),
        ("v tp1dp4 -> l tp4dp1", L("vision", 1, 1, 4, range(4)), L("language", 4, 1, 1, range(4)), "colocated"),
        ("v tp1dp4 -> l tp2cp2 sp", L("vision", 1, 1, 4, range(4)), L("language", 2, 2, 1, range(4), True),
         "colocated"),
    ],
    6: [
        ("v tp2dp3 -> l tp3dp2", L("vision", 2, 1, 3, range(6)), L("language", 3, 1, 2, range(6)), "colocated"),
    ],
    8: [
        ("v tp1dp4 -> l tp2dp2", L("vision", 1, 1, 4, range(4)), L("language", 2, 1, 2, range(4, 8)), "disaggregated"),
        ("v tp1dp4 -> l tp4dp1", L("vision", 1, 1, 4, range(4)), L("language", 4, 1, 1, range(4, 8)), "disaggregated"),
        ("v tp1dp4 -> l tp2cp2 sp", L("vision", 1, 1, 4, range(4)), L("language", 2, 2, 1, range(4, 8), True),
         "disaggregated"),
        ("v tp1dp3 -> l tp2dp2", L("vision", 1, 1, 3, range(3)), L("language", 2, 1, 2, range(3, 7)), "disaggregated"),
    ],
}


def micro_batch(src: StageLayout, dst: StageLayout, seed: int) -> BoundaryInputs:
    """12 samples, contiguous dp shares; each image is one placeholder block at a random offset."""
    rng = random.Random(seed)
    n = 12
    counts = [rng.choice(IMAGE_TOKENS) for _ in range(n)]
    positions = []
    for c in counts:
        start = rng.randrange(SEQ_LEN - c + 1)
        positions.append(range(start, start + c))
    return BoundaryInputs(counts, [i * src.dp // n for i in range(n)], [i * dst.dp // n for i in range(n)],
                          positions, SEQ_LEN)


# ---------------------------------------------------------------------------- baselines
def _rows_of(inp, dp_of, dp):
    """Global row ids of the samples a dp rank handles, in sample order."""
    out, g = [], 0
    for i, c in enumerate(inp.token_counts):
        if dp_of[i] == dp:
            out += range(g, g + c)
        g += c
    return out


def _shard_pick(comm, inp, rank):
    """Indices, into the replica's full row list, of the rows this destination rank keeps."""
    plan = comm.plan(inp)
    dst = plan.dst
    if not dst.contains(rank):
        return None
    full = _rows_of(inp, inp.dst_dp, dst.coord(rank).dp)
    g_of_pos = {}
    g = 0
    for i, c in enumerate(inp.token_counts):
        for j in range(c):
            g_of_pos[g] = (i, j)
            g += 1
    n = dst.cp * (dst.tp if dst.sequence_parallel else 1)
    c = dst.coord(rank)
    chunk = c.cp * dst.tp + c.tp if dst.sequence_parallel else c.cp
    size = SEQ_LEN // n
    keep = [k for k, g in enumerate(full) if inp.positions[g_of_pos[g][0]][g_of_pos[g][1]] // size == chunk]
    return torch.tensor(keep, dtype=torch.long)


class LeaderBroadcast:
    """Megatron MIMO bridge: leader P2P per dp replica pair, then broadcast in the tp x cp group.

    Routing is precomputed (as ours is, by its plan cache); `__call__` only moves data.
    """

    def __init__(self, inp, src, dst, groups, rank, pick, device):
        self.group, self.rank, self.pick = groups.boundary, rank, pick
        self.bcast_group = groups.stages["language"].model
        s_lead = {R: src.rank_at(0, 0, R) for R in range(src.dp)}
        d_lead = {j: dst.rank_at(0, 0, j) for j in range(dst.dp)}
        self.sends, self.recvs, self.local = [], [], []  # (peer, index) / (peer, rows) / index
        for R in range(src.dp):
            mine = _rows_of(inp, inp.src_dp, R)
            for j in range(dst.dp):
                need = set(_rows_of(inp, inp.dst_dp, j))
                both = torch.tensor([k for k, g in enumerate(mine) if g in need], dtype=torch.long, device=device)
                if not len(both):
                    continue
                if rank == s_lead[R] == d_lead[j]:
                    self.local.append((R, both))
                elif rank == s_lead[R]:
                    self.sends.append((d_lead[j], both))
                elif rank == d_lead[j]:
                    self.recvs.append((R, s_lead[R], len(both)))
        self.is_dst = dst.contains(rank)
        if self.is_dst:
            j = dst.coord(rank).dp
            self.root, self.n_full = d_lead[j], len(_rows_of(inp, inp.dst_dp, j))
            self.bcast_members = dst.tp * dst.cp

    def __call__(self, x):
        H, sent, ops, parts = x.shape[1], 0, [], {}
        for R, idx in self.local:
            parts[R] = x.index_select(0, idx)
        for peer, idx in self.sends:
            buf = x.index_select(0, idx)
            ops.append(dist.P2POp(dist.isend, buf, peer, group=self.group))
            sent += buf.numel() * buf.element_size()
        for R, peer, n in self.recvs:
            parts[R] = x.new_empty((n, H))
            ops.append(dist.P2POp(dist.irecv, parts[R], peer, group=self.group))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        if not self.is_dst:
            return None, sent
        if self.rank == self.root:
            full = torch.cat([parts[R] for R in sorted(parts)]) if parts else x.new_empty((0, H))
            sent += (self.bcast_members - 1) * full.numel() * full.element_size()
        else:
            full = x.new_empty((self.n_full, H))
        if self.bcast_members > 1:
            dist.broadcast(full, src=self.root, group=self.bcast_group)
        return full.index_select(0, self.pick), sent


class AllGatherAll:
    """Every rank's rows, padded to the largest, to every rank; destinations keep what they need."""

    def __init__(self, inp, src, dst, groups, rank, pick, device):
        self.group, self.n = groups.boundary, len(groups.boundary_ranks)
        self.pad = max(len(_rows_of(inp, inp.src_dp, R)) for R in range(src.dp))
        self.rows = None
        if dst.contains(rank):
            j, rows = dst.coord(rank).dp, []
            need = set(_rows_of(inp, inp.dst_dp, j))
            for R in range(src.dp):  # tp0 of each source replica: its replica's rows
                owner = groups.boundary_ranks.index(src.rank_at(0, 0, R))
                rows += [owner * self.pad + k for k, g in enumerate(_rows_of(inp, inp.src_dp, R)) if g in need]
            self.rows = torch.tensor(rows, dtype=torch.long, device=device).index_select(0, pick)

    def __call__(self, x):
        block = x.new_zeros((self.pad, x.shape[1]))
        block[: x.shape[0]] = x
        gathered = x.new_empty((self.n * self.pad, x.shape[1]))
        _all_gather_single(gathered, block, group=self.group)
        sent = (self.n - 1) * block.numel() * block.element_size()  # what this rank receives; sums to the total
        return (None if self.rows is None else gathered.index_select(0, self.rows)), sent


# ---------------------------------------------------------------------------- one rank
def _sync(device):
    if device.type == "cuda":  # GPU work is asynchronous: time it to completion
        torch.cuda.synchronize(device)


def _timed(fn, group, iters, device):
    times = []
    for _ in range(iters + 3):  # 3 warm-up exchanges
        dist.barrier(group=group)
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    t = torch.tensor(times[3:], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)  # an exchange lasts until its slowest rank
    return out, statistics.median(t.tolist())


def _bench_case(rank, label, src, dst, placement, hidden, iters, seed, device):
    groups = build_groups({"vision": src, "language": dst}, rank)
    try:
        if rank not in groups.boundary_ranks:
            return None
        inp = micro_batch(src, dst, seed)
        total = sum(inp.token_counts)
        X = torch.randn(total, hidden, generator=torch.Generator().manual_seed(seed))
        x = (X[_rows_of(inp, inp.src_dp, src.coord(rank).dp)] if src.contains(rank) else X[:0]).to(device)
        comm = BoundaryCommunicator(src, dst, groups, placement, hidden_size=hidden, dtype=x.dtype)
        pick = _shard_pick(comm, inp, rank)
        pick = pick.to(device) if pick is not None else None
        # The baselines' routing is precomputed, as ours is (its plan is cached per micro-batch).
        leader = LeaderBroadcast(inp, src, dst, groups, rank, pick, device)
        gather_all = AllGatherAll(inp, src, dst, groups, rank, pick, device)
        unchecked = BoundaryCommunicator(src, dst, groups, placement, validate=False)
        ours, t_ours = _timed(lambda: comm.exchange_rows(x, inp), groups.boundary, iters, device)
        ours_sent = comm.last_forward.bytes_sent
        _, t_unchecked = _timed(lambda: unchecked.exchange_rows(x, inp), groups.boundary, iters, device)
        (lead, lead_sent), t_lead = _timed(lambda: leader(x), groups.boundary, iters, device)
        (ag, ag_sent), t_ag = _timed(lambda: gather_all(x), groups.boundary, iters, device)
        if dst.contains(rank):
            assert torch.equal(ours, lead) and torch.equal(ours, ag), f"{label}: rank {rank} outputs differ"
        comm.exchange_grads(ours if dst.contains(rank) else x[:0], inp)  # any gradient: bytes only
        bwd = comm.last_backward
        sent = torch.tensor([ours_sent, lead_sent, ag_sent, bwd.bytes_sent], dtype=torch.float64, device=device)
        dist.all_reduce(sent, group=groups.boundary)
        ms = [t * 1e3 for t in (t_ours, t_unchecked, t_lead, t_ag)]
        return dict(label=label, placement=placement, ranks=len(groups.boundary_ranks),
                    bound=comm.last_forward.lower_bound_bytes, bytes=sent.tolist()[:3], ms=ms,
                    bwd=sent.tolist()[3], bwd_bound=bwd.lower_bound_bytes)
    finally:
        groups.destroy()


def _rank(rank, world, cases, hidden, iters, backend):
    """Every case on this rank (the launcher has joined the ranks with `backend`); rank 0's rows."""
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")  # one process per device
    rows = [_bench_case(rank, *case, hidden, iters, seed=n + 1, device=device) for n, case in enumerate(cases)]
    return rows if rank == 0 else None


def _launch(world, cases, hidden, iters, backend="gloo"):
    return run_distributed(_rank, world, timeout=900, backend=backend, pg_timeout_s=120,
                           args=(cases, hidden, iters, backend))[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"], help="nccl: one process per GPU")
    ap.add_argument("--max-world", type=int, default=None, help="only layout pairs on at most this many ranks")
    args = ap.parse_args(argv)
    worlds = [w for w in CASES if args.max_world is None or w <= args.max_world]
    rows = [row for world in worlds for row in _launch(world, CASES[world], args.hidden, args.iters, args.backend)]
    where = (f"nccl on {torch.cuda.device_count()} GPUs" if args.backend == "nccl"
             else f"gloo on {os.cpu_count()} CPU cores")
    mb = 1 / 2**20
    print(f"hidden {args.hidden}, fp32, 12 samples/micro-batch with 0-576 image tokens, seq {SEQ_LEN}, "
          f"{where}, median of {args.iters} exchanges (slowest rank)\n")
    print("| layout pair | placement | ranks | lower bound MB | ours MB (ratio) | leader+bcast MB (ratio) "
          "| all-gather MB (ratio) | ours ms | ours ms, no check | leader ms | all-gather ms "
          "| backward lower bound MB | ours backward MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def ratio(x, b):  # a zero bound (identical colocated layouts) is met only by zero bytes
        return f"{x / b:.3f}" if b else ("1.000" if x == 0 else "inf")

    for r in rows:
        b = r["bound"]
        cells = [f"{x * mb:.2f} ({ratio(x, b)})" for x in r["bytes"]]
        print(f"| {r['label']} | {r['placement']} | {r['ranks']} | {b * mb:.2f} | " + " | ".join(cells) + " | "
              + " | ".join(f"{t:.2f}" for t in r["ms"])
              + f" | {r['bwd_bound'] * mb:.2f} | {r['bwd'] * mb:.2f} ({ratio(r['bwd'], r['bwd_bound'])}) |")


if __name__ == "__main__":
    main()
