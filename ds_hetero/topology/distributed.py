"""Joining the default process group: the one place ds_hetero starts torch.distributed."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from ..patches import skip_cpu_shm_comm_build


def ensure_distributed(timeout_s: float) -> tuple[int, int]:
    """Join (or start) the default process group with the accelerator's backend."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    skip_cpu_shm_comm_build()
    if not dist.is_initialized():
        deepspeed.init_distributed(
            dist_backend=get_accelerator().communication_backend_name(), timeout=timedelta(seconds=timeout_s)
        )
    else:  # a process group made by the caller: let DeepSpeed's comm layer wrap it
        deepspeed.init_distributed(dist_backend=dist.get_backend())
    return dist.get_rank(), dist.get_world_size()
