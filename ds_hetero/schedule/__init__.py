"""Schedules: the order of stage work and boundary exchanges within one optimizer step."""

from .colocated import ColocatedSchedule
from .disaggregated import DisaggregatedSchedule
from .pipeline import PipelineSchedule

__all__ = ["ColocatedSchedule", "DisaggregatedSchedule", "PipelineSchedule"]
