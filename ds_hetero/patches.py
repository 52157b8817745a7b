"""Narrow adjustments of DeepSpeed's process-wide behaviour that ds_hetero depends on.

Each function here touches DeepSpeed global state on purpose; the docstring says why.
"""

from __future__ import annotations

import sys


def skip_cpu_shm_comm_build() -> None:
    """Stop DeepSpeed from JIT-compiling its shared-memory comm op on the CPU accelerator.

    Why: on CPU, `deepspeed.comm.torch.TorchBackend.__init__` calls `build_shm_op()`, which
    compiles `deepspeed_shm_comm` with ninja/g++ at every start of a fresh cache (45-65 s). The
    op only serves DeepSpeed's inference all-reduce, which training never uses. On other
    accelerators the function is left alone.

    The module must be reached through `sys.modules`: `import deepspeed.comm.torch as m` binds
    the `torch` package instead, because `deepspeed.comm` has an attribute named `torch`.
    """
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return
    import deepspeed.comm.torch  # noqa: F401 - make sure the module is loaded

    backend_module = sys.modules["deepspeed.comm.torch"]
    if getattr(backend_module.build_shm_op, "_ds_hetero_skipped", False):
        return

    def _no_shm_op():
        return None

    _no_shm_op._ds_hetero_skipped = True
    backend_module.build_shm_op = _no_shm_op
