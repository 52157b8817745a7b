"""The boundary between two stages: a pure routing plan and the communicator that runs it."""

from .plan import (
    BoundaryInputs,
    BoundaryPlan,
    Direction,
    RankPlan,
    build_plan,
    num_shards,
    shard_bounds,
    shard_index,
)

__all__ = [
    "BoundaryInputs",
    "BoundaryPlan",
    "Direction",
    "RankPlan",
    "build_plan",
    "num_shards",
    "shard_bounds",
    "shard_index",
]
