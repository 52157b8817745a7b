"""The boundary between two stages: a pure routing plan and the communicator that runs it."""

from .communicator import BoundaryCommunicator, ExchangeStats, inputs_from_input_ids
from .inputs import PLACEMENTS, BoundaryInputs, num_shards, shard_bounds, shard_index
from .plan import BoundaryPlan, Direction, RankPlan, build_plan

__all__ = [
    "BoundaryCommunicator",
    "BoundaryInputs",
    "BoundaryPlan",
    "Direction",
    "ExchangeStats",
    "PLACEMENTS",
    "RankPlan",
    "build_plan",
    "inputs_from_input_ids",
    "num_shards",
    "shard_bounds",
    "shard_index",
]
