"""BoundaryPlan: which boundary rows each rank sends to whom, and where they land (pure).

No torch and no torch.distributed here: the plan is a function of two layouts and the
micro-batch's per-sample facts, identical on every rank, tested exhaustively without processes.

Rows and their order
--------------------
A *row* is one image token of one sample: row (i, j) is the j-th image token of sample i of
the micro-batch, i.e. the j-th placeholder position of that sample. Its global index is
`g = sum(token_counts[:i]) + j`.

* Source order. Every rank of a source dp replica (its tp x cp group, the *source replicas*)
  holds all rows of the samples `src_dp` assigns to that replica: samples in ascending index,
  each sample's rows in token order. That is the projector output `[T_local, H]`.
* Destination order. A destination rank needs the rows of the samples `dst_dp` assigns to its
  dp replica whose positions fall into its sequence shard: samples in ascending index, then
  ascending position. This is the order of `embeds[local_samples, shard][image_mask]`, so a
  `masked_scatter` of the output into the local embeddings of the shard is exactly right.

Sequence-shard convention (the cp / sequence-parallel code must follow the same one)
------------------------------------------------------------------------------------
A sequence of length L (one padded sample, or one packed sequence; positions index into it) is
cut into `n = cp * (tp if sequence_parallel else 1)` contiguous, equal chunks (L % n == 0).
The destination rank at (tp t, cp c) holds chunk `c * tp + t` with sequence parallelism and
chunk `c` without: contiguous chunks per cp rank, each cut again into contiguous tp chunks
under sequence parallelism. See `shard_index` and `shard_bounds`.

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
from typing import Sequence

from ..errors import HeteroConfigError
from ..layout import StageLayout

PLACEMENTS = ("colocated", "disaggregated")


@dataclass(frozen=True)
class BoundaryInputs:
    """What every rank knows about one micro-batch at the boundary.

    token_counts[i]  image tokens of sample i (0 for a sample without image).
    src_dp[i]        source (vision) dp rank that encodes sample i.
    dst_dp[i]        destination (language) dp rank that consumes sample i.
    positions[i]     ascending positions of sample i's image placeholders in its sequence;
                     required when the destination shards the sequence (cp > 1, or sequence
                     parallelism with tp > 1), checked against token_counts whenever given.
    seq_len          length L of the sequence the positions index into: one int for all
                     samples (padded batch) or one per sample (packed: the pack's length).
    """

    token_counts: Sequence[int]
    src_dp: Sequence[int | None]
    dst_dp: Sequence[int | None]
    positions: Sequence[Sequence[int]] | None = None
    seq_len: int | Sequence[int] | None = None

    def __post_init__(self) -> None:
        # Tuples all the way down: hashable (plans are cached per inputs) and immutable.
        def tup(x):
            return None if x is None else tuple(x)

        object.__setattr__(self, "token_counts", tuple(self.token_counts))
        object.__setattr__(self, "src_dp", tuple(self.src_dp))
        object.__setattr__(self, "dst_dp", tuple(self.dst_dp))
        if self.positions is not None:
            object.__setattr__(self, "positions", tuple(tup(p) for p in self.positions))
        if self.seq_len is not None and not isinstance(self.seq_len, int):
            object.__setattr__(self, "seq_len", tuple(self.seq_len))

    @property
    def num_samples(self) -> int:
        return len(self.token_counts)


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


# ---------------------------------------------------------------------------- shard convention
def num_shards(dst: StageLayout) -> int:
    """Number of contiguous sequence chunks the destination cuts each sequence into."""
    return dst.cp * (dst.tp if dst.sequence_parallel else 1)


def shard_index(dst: StageLayout, rank: int) -> int:
    """Chunk of every sequence held by destination `rank` (see the module docstring)."""
    c = dst.coord(rank)
    return c.cp * dst.tp + c.tp if dst.sequence_parallel else c.cp


def shard_bounds(dst: StageLayout, rank: int, seq_len: int) -> tuple[int, int]:
    """[start, stop) positions of a length-`seq_len` sequence held by destination `rank`."""
    n = num_shards(dst)
    if seq_len % n:
        raise HeteroConfigError("boundary.seq_len", f"{seq_len} is not divisible by cp*tp(sp) = {n}")
    size = seq_len // n
    s = shard_index(dst, rank)
    return s * size, (s + 1) * size


# ---------------------------------------------------------------------------- validation
def _check_placement(src: StageLayout, dst: StageLayout, placement: str | None) -> str:
    a, b = set(src.ranks), set(dst.ranks)
    actual = "colocated" if a == b else "disaggregated" if not (a & b) else None
    if actual is None:
        raise HeteroConfigError(
            "placement", f"stages {src.name!r} {sorted(a)} and {dst.name!r} {sorted(b)} partly overlap; "
            "use the same ranks (colocated) or disjoint ranks (disaggregated)")
    if placement is not None and placement != actual:
        if placement not in PLACEMENTS:
            raise HeteroConfigError("placement", f"{placement!r} is not one of {PLACEMENTS}")
        raise HeteroConfigError("placement", f"{placement!r} given but the stages' ranks are {actual}")
    return actual


def _check_dp(values, n: int, size: int, name: str, stage: str) -> None:
    if len(values) != n:
        raise HeteroConfigError(f"boundary.{name}", f"{len(values)} entries for {n} samples")
    for i, d in enumerate(values):
        if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d < size:
            raise HeteroConfigError(
                f"boundary.{name}[{i}]", f"sample {i} is assigned to {d!r}, not to a dp rank of "
                f"stage {stage!r} (0..{size - 1}); every sample needs one")


def _check_inputs(src: StageLayout, dst: StageLayout, inputs: BoundaryInputs) -> None:
    n = inputs.num_samples
    for i, c in enumerate(inputs.token_counts):
        if not isinstance(c, int) or isinstance(c, bool) or c < 0:
            raise HeteroConfigError(f"boundary.token_counts[{i}]", f"{c!r} is not a count >= 0")
    _check_dp(inputs.src_dp, n, src.dp, "src_dp", src.name)
    _check_dp(inputs.dst_dp, n, dst.dp, "dst_dp", dst.name)
    shards = num_shards(dst)
    if inputs.positions is None:
        if shards > 1:
            raise HeteroConfigError(
                "boundary.positions", f"stage {dst.name!r} cuts the sequence into {shards} shards "
                "(cp or sequence parallelism): image-token positions and seq_len are required")
        return
    if len(inputs.positions) != n:
        raise HeteroConfigError("boundary.positions", f"{len(inputs.positions)} entries for {n} samples")
    lens = _seq_lens(inputs)
    if lens is None:
        raise HeteroConfigError("boundary.seq_len", "required together with positions")
    for i, (pos, c, length) in enumerate(zip(inputs.positions, inputs.token_counts, lens)):
        if len(pos) != c:
            raise HeteroConfigError(
                f"boundary.positions[{i}]", f"sample {i} has {len(pos)} image placeholder tokens but "
                f"token_counts says the encoder produces {c} rows for it")
        if length % shards:
            raise HeteroConfigError(
                "boundary.seq_len", f"sample {i}: {length} is not divisible by the {shards} shards of {dst.name!r}")
        if any(not 0 <= p < length for p in pos) or any(a >= b for a, b in zip(pos, pos[1:])):
            raise HeteroConfigError(f"boundary.positions[{i}]", f"not ascending distinct positions in [0, {length})")


def _seq_lens(inputs: BoundaryInputs) -> tuple[int, ...] | None:
    if inputs.seq_len is None:
        return None
    if isinstance(inputs.seq_len, int):
        return (inputs.seq_len,) * inputs.num_samples
    if len(inputs.seq_len) != inputs.num_samples:
        raise HeteroConfigError("boundary.seq_len", f"{len(inputs.seq_len)} entries for {inputs.num_samples} samples")
    return inputs.seq_len


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
            self._cache["lens"] = _seq_lens(self.inputs)
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
    actual = _check_placement(src, dst, placement)
    _check_inputs(src, dst, inputs)
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
