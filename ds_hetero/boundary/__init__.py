"""The boundary between two stages: a pure routing plan and the communicator that runs it."""

from .communicator import BoundaryCommunicator, ExchangeStats, inputs_from_input_ids
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
    "BoundaryCommunicator",
    "BoundaryInputs",
    "BoundaryPlan",
    "Direction",
    "ExchangeStats",
    "RankPlan",
    "build_plan",
    "inputs_from_input_ids",
    "num_shards",
    "shard_bounds",
    "shard_index",
]
