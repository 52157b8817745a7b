"""BoundaryPlan: which boundary rows each rank sends to whom, and where they land (pure).

No torch and no torch.distributed here: the plan is a function of two layouts and the
micro-batch's per-sample facts, identical on every rank, tested exhaustively without processes.

Rows, their order on each side and the sequence-shard convention are defined in inputs.py.

Routing rules (what makes the exchange exact and byte-minimal)
--------------------------------------------------------------
* The *copies* of a row are the destination ranks that need it: every tp rank of its chunk
  without sequence parallelism (destination replicas), exactly one rank with it.
* A copy whose destination rank is itself a source replica of the row is a local copy: no bytes.
* Every other copy is sent exactly once, by one source replica; the replicas share the sending
  (copy c of row g is sent by replica `(g + c) % k`, a fixed rule every rank evaluates alone).
  Hence rows sent == the lower bound: every (row, needing rank) pair the rank does not hold.
* Backward: exactly one *designated* copy per row returns the gradient (a local copy when there
  is one, else copy `(g // k) % n`): the tp convention makes the replicas' gradients identical,
  summing them would scale by tp. It goes back to the replica that sent it, which then *owns*
  the row's gradient. A completion exchange among the source replicas (each sends the rows it
  owns to the others) gives every replica the full, identical gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..layout import StageLayout
from .inputs import BoundaryInputs, check_inputs, check_placement, num_shards, seq_lens


@dataclass(frozen=True)
class Direction:
    """One all_to_all_single plus local copies, from the point of view of one rank.

    send_index   rows of this rank's input to send, concatenated in peer order
    send_splits  rows to each peer (peer order of the group)
    recv_splits  rows from each peer
    recv_dest    output row of each received row, in receive-buffer order
    local_src    input rows copied locally ...
    local_dst    ... to these output rows
    n_out        rows of the output (every one is written exactly once, except, in the
                 gradient exchange, rows owned by another source replica: completion fills them)
    """

    send_index: tuple[int, ...]
    send_splits: tuple[int, ...]
    recv_splits: tuple[int, ...]
    recv_dest: tuple[int, ...]
    local_src: tuple[int, ...] = ()
    local_dst: tuple[int, ...] = ()
    n_out: int = 0

    @property
    def rows_sent(self) -> int:
        return sum(self.send_splits)

    @property
    def rows_received(self) -> int:
        return sum(self.recv_splits)


@dataclass(frozen=True)
class RankPlan:
    """Everything one rank does at the boundary for one micro-batch.

    forward     over the boundary group: source rows [n_in, H] -> destination rows [n_out, H]
    backward    over the boundary group: gradient rows [n_out, H] -> source gradient [n_in, H]
                (designated copies only)
    completion  over the source replica group (`replicas`, sorted): owned gradient rows to the
                other replicas; None when the rank is no source or has no other replica
    """

    rank: int
    n_in: int
    n_out: int
    forward: Direction
    backward: Direction
    completion: Direction | None
    replicas: tuple[int, ...]


# ---------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class BoundaryPlan:
    """The routing of one micro-batch; build with `build_plan`. `peers` is the group order."""

    src: StageLayout
    dst: StageLayout
    inputs: BoundaryInputs
    placement: str
    peers: tuple[int, ...]
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    # -- per-row geometry, shared by the sending and the receiving side so both agree --------
    def _holders(self, replica: int) -> tuple[int, ...]:
        """Source replicas of src dp rank `replica`, in local order (tp fastest, then cp)."""
        key = ("holders", replica)
        if key not in self._cache:
            s = self.src
            self._cache[key] = tuple(s.rank_at(t, c, replica) for c in range(s.cp) for t in range(s.tp))
        return self._cache[key]

    def _shard_of(self, i: int, j: int) -> int:
        n = num_shards(self.dst)
        if n == 1:
            return 0
        if "lens" not in self._cache:
            self._cache["lens"] = seq_lens(self.inputs)
        return self.inputs.positions[i][j] // (self._cache["lens"][i] // n)

    def _copies(self, dp: int, shard: int) -> tuple[int, ...]:
        """Destination ranks that need a row of dp replica `dp` lying in chunk `shard`."""
        key = ("copies", dp, shard)
        if key not in self._cache:
            d = self.dst
            if d.sequence_parallel:
                ranks = (d.rank_at(shard % d.tp, shard // d.tp, dp),)
            else:
                ranks = tuple(d.rank_at(t, shard, dp) for t in range(d.tp))
            self._cache[key] = ranks
        return self._cache[key]

    def _route(self, i: int, j: int, g: int):
        """(holders, copies, local flags, designated copy, owner) of row (i, j), global index g."""
        holders = self._holders(self.inputs.src_dp[i])
        copies = self._copies(self.inputs.dst_dp[i], self._shard_of(i, j))
        local = [d in holders for d in copies]
        k = len(holders)
        if any(local):
            designated = local.index(True)
            owner = copies[designated]
        else:
            designated = (g // k) % len(copies)
            owner = holders[(g + designated) % k]
        return holders, copies, local, designated, owner

    def _sample_offsets(self):
        """Global row offset of each sample, and its offset inside its source replica's rows."""
        if "offsets" not in self._cache:
            g_off, s_off, seen = [], [], {}
            total = 0
            for c, r in zip(self.inputs.token_counts, self.inputs.src_dp):
                g_off.append(total)
                s_off.append(seen.get(r, 0))
                seen[r] = seen.get(r, 0) + c
                total += c
            self._cache["offsets"] = (g_off, s_off, seen)
        return self._cache["offsets"]

    # -- public ----------------------------------------------------------------------------
    def for_rank(self, rank: int) -> RankPlan:
        key = ("rank", rank)
        if key not in self._cache:
            if rank not in self.peers:
                raise KeyError(f"rank {rank} is in neither {self.src.name!r} nor {self.dst.name!r}")
            self._cache[key] = _rank_plan(self, rank)
        return self._cache[key]

    def rows_sent(self) -> int:
        """Rows all ranks send over the network in the forward (sum of every send split)."""
        return sum(self.for_rank(r).forward.rows_sent for r in self.peers)

    def lower_bound_rows(self) -> int:
        """Rows some destination needs and does not hold, once per needing rank (from the definition)."""
        if "lower_bound" not in self._cache:
            g_off, _, _ = self._sample_offsets()
            total = 0
            for i, count in enumerate(self.inputs.token_counts):
                holders = set(self._holders(self.inputs.src_dp[i]))
                for j in range(count):
                    total += sum(d not in holders for d in self._copies(self.inputs.dst_dp[i], self._shard_of(i, j)))
            self._cache["lower_bound"] = total
        return self._cache["lower_bound"]


def build_plan(
    src: StageLayout, dst: StageLayout, inputs: BoundaryInputs, placement: str | None = None
) -> BoundaryPlan:
    """Validate the inputs (HeteroConfigError, identically on every rank) and make the plan."""
    if not isinstance(inputs, BoundaryInputs):
        inputs = BoundaryInputs(**inputs)
    actual = check_placement(src, dst, placement)
    check_inputs(src, dst, inputs)
    peers = tuple(sorted(set(src.ranks) | set(dst.ranks)))
    return BoundaryPlan(src=src, dst=dst, inputs=inputs, placement=actual, peers=peers)


def _rank_plan(plan: BoundaryPlan, rank: int) -> RankPlan:
    """One rank's part; the source side and the destination side walk rows in the same g order."""
    inputs, peers = plan.inputs, plan.peers
    g_off, s_off, per_replica = plan._sample_offsets()
    send = {p: [] for p in peers}        # forward: my source rows to each peer
    grad_recv = {p: [] for p in peers}   # backward: my source rows whose gradient each peer returns
    recv = {p: [] for p in peers}        # forward: my output rows from each peer
    grad_send = {p: [] for p in peers}   # backward: my output rows whose gradient I return
    local_src, local_dst, glocal_src, glocal_dst = [], [], [], []
    owned, replicas, n_in = {}, (), 0

    if plan.src.contains(rank):
        replica = plan.src.coord(rank).dp
        holders = plan._holders(replica)
        replicas, n_in = tuple(sorted(holders)), per_replica.get(replica, 0)
        owned = {h: [] for h in replicas}
        for i in (i for i, r in enumerate(inputs.src_dp) if r == replica):
            for j in range(inputs.token_counts[i]):
                g, li = g_off[i] + j, s_off[i] + j
                _, copies, local, designated, owner = plan._route(i, j, g)
                owned[owner].append(li)
                for c, d in enumerate(copies):
                    if not local[c] and holders[(g + c) % len(holders)] == rank:
                        send[d].append(li)
                        if c == designated:
                            grad_recv[d].append(li)

    n_out = 0
    if plan.dst.contains(rank):
        dp = plan.dst.coord(rank).dp
        for i in (i for i, r in enumerate(inputs.dst_dp) if r == dp):
            for j in range(inputs.token_counts[i]):
                g = g_off[i] + j
                holders, copies, local, designated, _ = plan._route(i, j, g)
                if rank not in copies:
                    continue  # outside this rank's sequence shard
                c, o = copies.index(rank), n_out
                n_out += 1
                if local[c]:
                    local_src.append(s_off[i] + j)
                    local_dst.append(o)
                    if c == designated:
                        glocal_src.append(o)
                        glocal_dst.append(s_off[i] + j)
                else:
                    sender = holders[(g + c) % len(holders)]
                    recv[sender].append(o)
                    if c == designated:
                        grad_send[sender].append(o)

    def cat(d):
        return tuple(x for p in peers for x in d[p])

    def splits(d):
        return tuple(len(d[p]) for p in peers)

    forward = Direction(cat(send), splits(send), splits(recv), cat(recv),
                        tuple(local_src), tuple(local_dst), n_out)
    backward = Direction(cat(grad_send), splits(grad_send), splits(grad_recv), cat(grad_recv),
                         tuple(glocal_src), tuple(glocal_dst), n_in)
    completion = None
    if len(replicas) > 1:
        mine = owned[rank]
        completion = Direction(
            send_index=tuple(x for q in replicas if q != rank for x in mine),
            send_splits=tuple(0 if q == rank else len(mine) for q in replicas),
            recv_splits=tuple(0 if q == rank else len(owned[q]) for q in replicas),
            recv_dest=tuple(x for q in replicas if q != rank for x in owned[q]),
            n_out=n_in,
        )
    return RankPlan(rank=rank, n_in=n_in, n_out=n_out, forward=forward, backward=backward,
                    completion=completion, replicas=replicas)
