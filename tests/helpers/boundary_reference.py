"""What each rank holds and needs at the boundary, from the definitions alone (not from the plan).

Shared by the pure plan tests and the multi-process communicator tests, so both compare the
plan against the same independent reference.
"""


def src_rows(src, inputs, rank):
    """The (sample, token) labels rank holds as a source, in source order."""
    if not src.contains(rank):
        return []
    dp = src.coord(rank).dp
    rows = []
    for i, d in enumerate(inputs.src_dp):
        # a whole sample (an int), or (rows, dp) runs in token order (a sample split by images)
        runs = d if isinstance(d, tuple) else ((inputs.token_counts[i], d),)
        j = 0
        for n, r in runs:
            rows += [(i, j + k) for k in range(n)] if r == dp else []
            j += n
    return rows


def dst_rows(dst, inputs, rank):
    """The labels rank needs as a destination, in destination order (independent of the plan)."""
    if not dst.contains(rank):
        return []
    c = dst.coord(rank)
    chunks = dst.cp * (dst.tp if dst.sequence_parallel else 1)
    chunk = c.cp * (dst.tp if dst.sequence_parallel else 1) + (c.tp if dst.sequence_parallel else 0)
    rows = []
    for i, r in enumerate(inputs.dst_dp):
        if r != c.dp:
            continue
        for j in range(inputs.token_counts[i]):
            if chunks > 1:
                length = inputs.seq_len if isinstance(inputs.seq_len, int) else inputs.seq_len[i]
                lo, hi = chunk * length // chunks, (chunk + 1) * length // chunks
                if not lo <= inputs.positions[i][j] < hi:
                    continue
            rows.append((i, j))
    return rows


def lower_bound(src, dst, inputs):
    """(row, needing rank) pairs where the rank is not a source replica of the row (does not hold it)."""
    held = {r: set(src_rows(src, inputs, r)) for r in src.ranks}
    return sum(label not in held.get(r, ()) for r in dst.ranks for label in dst_rows(dst, inputs, r))


def backward_lower_bound(src, dst, inputs):
    """(row, source replica) pairs where the replica is no destination copy of the row: it needs the
    row's gradient and cannot take it locally (a replica that is a copy has it, identical by tp)."""
    needed = {r: set(dst_rows(dst, inputs, r)) for r in dst.ranks}
    return sum(label not in needed.get(r, ()) for r in src.ranks for label in src_rows(src, inputs, r))
