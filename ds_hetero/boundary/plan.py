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
* Backward: every source replica needs the full gradient of every row, taken from exactly one
  copy (the tp convention makes the copies' gradients identical, not partial; summing two would
  scale by tp). A replica that holds a local copy takes its gradient from it: no bytes. When no
  replica holds a copy, the *designated* copy `(g // k) % n` returns it to the replica that sent
  it. Either way one replica with the gradient *owns* the row and, in a completion exchange among
  the source replicas, sends it to each replica holding no copy of it. Hence backward rows sent
  == the backward lower bound: every (row, source replica) pair where the replica is no copy.
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
                 gradient exchange, rows this replica holds no copy of and does not own: the
                 completion fills them)
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
                (local copies, and designated copies of rows no source replica holds a copy of)
    completion  over the source replica group (`replicas`, sorted): owned gradient rows to the
                replicas holding no copy of them; None when the rank is no source or when the
                group has nothing to complete (e.g. identical colocated layouts)
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
        """(holders, copies, local flags, designated copy or None, owner) of row (i, j), global index g.

        The owner is a source replica that has the row's gradient after the backward exchange: one
        holding a local copy (rotated by g to share the completion sending), else the replica that
        sent the designated copy (the designated copies rotate too, spreading the returns).
        """
        holders = self._holders(self._rows()[1][g])
        copies = self._copies(self.inputs.dst_dp[i], self._shard_of(i, j))
        local = [d in holders for d in copies]
        k = len(holders)
        if any(local):
            mine = [d for d, here in zip(copies, local) if here]
            return holders, copies, local, None, mine[g % len(mine)]
        designated = (g // k) % len(copies)
        return holders, copies, local, designated, holders[(g + designated) % k]

    def _rows(self):
        """(global offset of each sample, source replica of each row g, g's index in its replica's
        rows, rows per replica): source order is ascending g within each replica (inputs.py)."""
        if "rows" not in self._cache:
            g_off, row_src, row_local, per_replica = [], [], [], {}
            for i in range(self.inputs.num_samples):
                g_off.append(len(row_src))
                for rows, r in self.inputs.source_runs(i):
                    for _ in range(rows):
                        row_src.append(r)
                        row_local.append(per_replica.get(r, 0))
                        per_replica[r] = per_replica.get(r, 0) + 1
            self._cache["rows"] = (g_off, row_src, row_local, per_replica)
        return self._cache["rows"]

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

    def backward_rows_sent(self) -> int:
        """Rows all ranks send over the network in the backward (gradient exchange and completion)."""
        return sum(rp.backward.rows_sent + (rp.completion.rows_sent if rp.completion else 0)
                   for rp in map(self.for_rank, self.peers))

    def lower_bound_rows(self) -> int:
        """Rows some destination needs and does not hold, once per needing rank (from the definition)."""
        return self._lower_bounds()[0]

    def backward_lower_bound_rows(self) -> int:
        """Row gradients some source replica needs and holds no copy of, once per replica (definition)."""
        return self._lower_bounds()[1]

    def _lower_bounds(self) -> tuple[int, int]:
        """(forward, backward): over every row, copies that are no holder, holders that are no copy."""
        if "lower_bounds" not in self._cache:
            fwd = bwd = 0
            g_off, row_src, _, _ = self._rows()
            for i, count in enumerate(self.inputs.token_counts):
                for j in range(count):
                    holders = self._holders(row_src[g_off[i] + j])
                    copies = self._copies(self.inputs.dst_dp[i], self._shard_of(i, j))
                    fwd += sum(d not in holders for d in copies)
                    bwd += sum(h not in copies for h in holders)
            self._cache["lower_bounds"] = (fwd, bwd)
        return self._cache["lower_bounds"]


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
    g_off, row_src, row_local, per_replica = plan._rows()
    send = {p: [] for p in peers}        # forward: my source rows to each peer
    grad_recv = {p: [] for p in peers}   # backward: my source rows whose gradient each peer returns
    recv = {p: [] for p in peers}        # forward: my output rows from each peer
    grad_send = {p: [] for p in peers}   # backward: my output rows whose gradient I return
    local_src, local_dst, glocal_src, glocal_dst = [], [], [], []
    replicas, n_in, completing = (), 0, 0

    if plan.src.contains(rank):
        replica = plan.src.coord(rank).dp
        holders = plan._holders(replica)
        replicas, n_in = tuple(sorted(holders)), per_replica.get(replica, 0)
        owe = {h: [] for h in replicas}   # completion: my owned rows each replica lacks
        owed = {h: [] for h in replicas}  # completion: my rows each replica owns and I lack
        for i in range(inputs.num_samples):
            for j in range(inputs.token_counts[i]):
                g, li = g_off[i] + j, row_local[g_off[i] + j]
                if row_src[g] != replica:
                    continue
                _, copies, local, designated, owner = plan._route(i, j, g)
                for c, d in enumerate(copies):
                    if not local[c] and holders[(g + c) % len(holders)] == rank:
                        send[d].append(li)
                        if c == designated:
                            grad_recv[d].append(li)
                # Replicas holding no copy get the gradient from the owner (which already has it).
                lacking = [h for h in holders if h not in copies and h != owner]
                completing += len(lacking)  # the same count on every replica of the group
                if owner == rank:
                    for h in lacking:
                        owe[h].append(li)
                elif rank in lacking:
                    owed[owner].append(li)

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
                if local[c]:  # this rank is also a source replica of the row: copy both ways
                    local_src.append(row_local[g])
                    local_dst.append(o)
                    glocal_src.append(o)
                    glocal_dst.append(row_local[g])
                else:
                    sender = holders[(g + c) % len(holders)]
                    recv[sender].append(o)
                    if c == designated:
                        grad_send[sender].append(o)

    def cat(d, order=peers):
        return tuple(x for p in order for x in d[p])

    def splits(d, order=peers):
        return tuple(len(d[p]) for p in order)

    forward = Direction(cat(send), splits(send), splits(recv), cat(recv),
                        tuple(local_src), tuple(local_dst), n_out)
    backward = Direction(cat(grad_send), splits(grad_send), splits(grad_recv), cat(grad_recv),
                         tuple(glocal_src), tuple(glocal_dst), n_in)
    # No collective when the whole replica group has nothing to complete (every replica a copy).
    completion = None
    if completing:
        completion = Direction(cat(owe, replicas), splits(owe, replicas), splits(owed, replicas),
                               cat(owed, replicas), n_out=n_in)
    return RankPlan(rank=rank, n_in=n_in, n_out=n_out, forward=forward, backward=backward,
                    completion=completion, replicas=replicas)
