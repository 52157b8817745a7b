"""Boundary inputs of a micro-batch, row order on both sides, the sequence-shard convention (pure).

Rows and their order
--------------------
A *row* is one image token of one sample: row (i, j) is the j-th image token of sample i of
the micro-batch, i.e. the j-th placeholder position of that sample. Its global index is
`g = sum(token_counts[:i]) + j`.

* Source order. Every rank of a source dp replica (its tp x cp group, the *source replicas*)
  holds all rows `src_dp` assigns to that replica in ascending global index g: samples in
  ascending index, each sample's rows in token order. That is the projector output `[T_local, H]`.
  A sample goes to one replica whole (`src_dp[i]` an int) or in runs of rows (`src_dp[i]` a
  tuple of `(rows, dp)` pairs in token order: e.g. the images of one sample encoded on different
  replicas, see ds_hetero/step/balance.py); either way the rule above fixes the order.
* Destination order. A destination rank needs the rows of the samples `dst_dp` assigns to its
  dp replica whose positions fall into its sequence shard: samples in ascending index, then
  ascending position. This is the order of `embeds[local_samples, shard][image_mask]`, so a
  `masked_scatter` of the output into the local embeddings of the shard is exactly right
  (packed sequences: list a rank's samples in the order of its packed rows, flattened).

Sequence-shard convention (the cp / sequence-parallel code must follow the same one)
------------------------------------------------------------------------------------
A sequence of length L (one padded sample, or one packed sequence; positions index into it) is
cut into `n = cp * (tp if sequence_parallel else 1)` contiguous, equal chunks (L % n == 0).
The destination rank at (tp t, cp c) holds chunk `c * tp + t` with sequence parallelism and
chunk `c` without: contiguous chunks per cp rank, each cut again into contiguous tp chunks
under sequence parallelism. See `shard_index` and `shard_bounds`.

Validation here runs identically on every rank (it sees only data every rank has), so a bad
micro-batch raises HeteroConfigError everywhere before any collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import HeteroConfigError
from ..layout import StageLayout

PLACEMENTS = ("colocated", "disaggregated", "mixed")


@dataclass(frozen=True)
class BoundaryInputs:
    """What every rank knows about one micro-batch at the boundary.

    token_counts[i]  image tokens of sample i (0 for a sample without image).
    src_dp[i]        source (vision) dp rank that encodes sample i; or, to split a sample,
                     a tuple of `(rows, dp)` runs in token order whose rows add up to
                     token_counts[i] (e.g. one run per image, see ds_hetero/step/balance.py).
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
        object.__setattr__(self, "src_dp", tuple(
            tuple(tuple(run) for run in d) if isinstance(d, (list, tuple)) else d for d in self.src_dp))
        object.__setattr__(self, "dst_dp", tuple(self.dst_dp))
        if self.positions is not None:
            object.__setattr__(self, "positions", tuple(tup(p) for p in self.positions))
        if self.seq_len is not None and not isinstance(self.seq_len, int):
            object.__setattr__(self, "seq_len", tuple(self.seq_len))

    @property
    def num_samples(self) -> int:
        return len(self.token_counts)

    def source_runs(self, i: int) -> tuple[tuple[int, int], ...]:
        """Sample i's rows as `(rows, source dp)` runs in token order (one run for a whole sample)."""
        d = self.src_dp[i]
        return d if isinstance(d, tuple) else ((self.token_counts[i], d),)


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
def check_placement(src: StageLayout, dst: StageLayout, placement: str | None) -> str:
    """The relation of two stages' ranks: "colocated" (the same) or "disaggregated" (disjoint).

    `placement` "mixed" (each encoder colocated with the language stage or apart from it) or
    None accepts either; any other value must be the relation itself. Partial overlaps raise.
    """
    a, b = set(src.ranks), set(dst.ranks)
    actual = "colocated" if a == b else "disaggregated" if not (a & b) else None
    if actual is None and b < a:
        # the language's first pipeline stage inside the encoder's ranks (colocated with pp > 1):
        # the plan is the same arithmetic, rows a rank already holds are copied locally
        actual = "nested"
    if actual is None:
        raise HeteroConfigError(
            "placement", f"stages {src.name!r} {sorted(a)} and {dst.name!r} {sorted(b)} partly overlap; "
            "use the same ranks (colocated) or disjoint ranks (disaggregated)")
    if placement is not None and placement != "mixed" and placement != actual:
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


def _check_runs(runs: tuple, count: int, src: StageLayout, i: int) -> int:
    """Validate sample i's `(rows, dp)` runs; returns a valid dp for `_check_dp` (the first run's)."""
    field = f"boundary.src_dp[{i}]"
    for run in runs:
        if len(run) != 2 or any(not isinstance(x, int) or isinstance(x, bool) for x in run) or run[0] < 1:
            raise HeteroConfigError(field, f"run {run!r} is not a pair (rows >= 1, dp rank)")
        if not 0 <= run[1] < src.dp:
            raise HeteroConfigError(field, f"run {run!r} names no dp rank of stage {src.name!r} (0..{src.dp - 1})")
    if not runs or sum(r for r, _ in runs) != count:
        raise HeteroConfigError(
            field, f"runs {runs!r} cover {sum(r for r, _ in runs)} rows but token_counts[{i}] is {count}; "
            "the runs of a split sample must cover its rows exactly")
    return runs[0][1]


def check_inputs(src: StageLayout, dst: StageLayout, inputs: BoundaryInputs) -> None:
    n = inputs.num_samples
    for i, c in enumerate(inputs.token_counts):
        if not isinstance(c, int) or isinstance(c, bool) or c < 0:
            raise HeteroConfigError(f"boundary.token_counts[{i}]", f"{c!r} is not a count >= 0")
    # A split sample's runs are checked here; `_check_dp` then sees its first run's dp rank.
    src_dp = [_check_runs(d, c, src, i) if isinstance(d, tuple) else d
              for i, (d, c) in enumerate(zip(inputs.src_dp, inputs.token_counts))]
    _check_dp(src_dp if len(inputs.src_dp) == n else inputs.src_dp, n, src.dp, "src_dp", src.name)
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
    lens = seq_lens(inputs)
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


def seq_lens(inputs: BoundaryInputs) -> tuple[int, ...] | None:
    if inputs.seq_len is None:
        return None
    if isinstance(inputs.seq_len, int):
        return (inputs.seq_len,) * inputs.num_samples
    if len(inputs.seq_len) != inputs.num_samples:
        raise HeteroConfigError("boundary.seq_len", f"{len(inputs.seq_len)} entries for {inputs.num_samples} samples")
    return inputs.seq_len
