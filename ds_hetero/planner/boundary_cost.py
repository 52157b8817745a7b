"""Boundary bytes of a candidate, from the boundary's own plan (ds_hetero/boundary/plan.py).

Per micro-batch, the planner builds the `BoundaryPlan` the engine would build (samples cut by
each stage's dp as batching.py does, every sample with `image_tokens` placeholders at
positions 1..K, right after BOS) and takes its forward and backward lower bounds, which the
plan's rows sent equal (tests/parallel/test_boundary_plan.py checks it exhaustively). Rows are boundary rows of hidden x dtype bytes.

A plan walks every row, so for a large micro-batch the image tokens and the sequence are both
divided by a common factor g (keeping each sequence shard whole) and the rows multiplied by g
back: exact without sequence sharding (rows scale with tokens per sample), and exact up to the
rounding of a shard edge inside the image block with it.
"""

from __future__ import annotations

from functools import lru_cache
from math import gcd

from ..boundary.inputs import BoundaryInputs, num_shards
from ..boundary.plan import build_plan
from ..config import HeteroConfig
from ..context_parallel.sequence import padded_length

MAX_ROWS = 2_048  # rows of one planned micro-batch before the tokens are scaled down (planning speed)


def boundary_rows(cfg: HeteroConfig, image_tokens: int, seq_len: int) -> tuple[int, int]:
    """(forward rows sent, backward rows sent) in one exchange (one encoder pass), all ranks together.

    An encoder pass feeds micro_batches / passes language micro-batches (schedule/stage_work.py):
    its samples go to the language dp rank of their position inside their micro-batch."""
    src, dst = cfg.stages["vision"], cfg.language
    passes = cfg.micro_batches_of("vision")
    return exchange_rows(src, dst, cfg.placement, cfg.global_batch_size // passes, cfg.micro_batch_size("vision"),
                 cfg.global_batch_size // cfg.micro_batches, cfg.micro_batch_size("language"), image_tokens, seq_len)


def modelled_rows(cand, samples: int, image_tokens: int) -> tuple[int, int]:
    """(forward, backward) rows of one exchange for a placement the boundary plan does not cover yet
    (a language pipeline: the rows go to its first stage). Every row is priced as moved: to each
    language tp replica (one rank with sequence parallelism), its gradient back to each of the
    encoder's tp replicas; the local copies a colocated rank may hold (at most 1 / pp of them) are
    ignored. first_stage moves nothing: the encoder's rows are on the ranks that need them."""
    if cand.megatron or not image_tokens:
        return 0, 0
    rows = samples * image_tokens
    copies = 1 if cand.language.sequence_parallel else cand.language.tp
    return rows * copies, rows * cand.vision.tp


@lru_cache(maxsize=4096)
def exchange_rows(src, dst, placement, samples, v_size, l_mb, l_size, k, seq_len):
    if k == 0 or samples == 0:
        return 0, 0
    shards = num_shards(dst)
    if shards > 1:  # the engine pads every sequence to a multiple of the shard count (context_parallel)
        seq_len = padded_length(seq_len, dst)
    g = 1
    if samples * k > MAX_ROWS:
        room = gcd(k, seq_len // shards)
        for d in range(1, room + 1):
            if room % d == 0 and samples * k // d <= MAX_ROWS:
                g = d
                break
        else:
            g = room
    k_g, s_g = k // g, seq_len // g
    sharded = shards > 1
    inputs = BoundaryInputs(
        token_counts=[k_g] * samples,
        # the engine's source of a sample by position (step/step_plan.py): i // v_size when dp divides the
        # pass, and defined when it does not (more encoder ranks than samples, balance tokens)
        src_dp=[i * src.dp // samples for i in range(samples)],
        dst_dp=[(i % l_mb) // l_size for i in range(samples)],
        positions=[list(range(1, 1 + k_g))] * samples if sharded else None,
        seq_len=s_g if sharded else None,
    )
    plan = build_plan(src, dst, inputs, placement)
    # the plan's rows sent equal these bounds (tests/parallel/test_boundary_plan.py); the bounds skip
    # building every rank's send lists, which is what makes planning 1024 ranks affordable
    return plan.lower_bound_rows() * g, plan.backward_lower_bound_rows() * g
