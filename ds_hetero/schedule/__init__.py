"""Schedules: the order of stage work and boundary exchanges within one optimizer step."""

from .colocated import ColocatedSchedule

__all__ = ["ColocatedSchedule"]
