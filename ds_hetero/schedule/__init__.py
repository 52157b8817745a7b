"""Schedules: the order of stage work and boundary exchanges within one optimizer step."""

from .colocated import ColocatedSchedule
from .disaggregated import DisaggregatedSchedule

__all__ = ["ColocatedSchedule", "DisaggregatedSchedule"]
