"""Every change ds_hetero makes to process-wide state of other libraries, in one place.

Each exists because the library offers no per-call way to get the behaviour; each is narrow,
idempotent, and can be undone. Nothing else in ds_hetero writes another library's globals.

| patch | where it is made | why | how it is undone |
| --- | --- | --- | --- |
| `deepspeed.comm.torch.build_shm_op` -> no-op (CPU accelerator only) | `skip_cpu_shm_comm_build`, when DeepSpeed is imported in a process that imported ds_hetero (import_hooks.py; at `import ds_hetero` if DeepSpeed already is) | DeepSpeed JIT-compiles its shared-memory inference op (45-65 s) at every comm start on CPU; training never uses it | `restore_cpu_shm_comm_build()` |
| `deepspeed.initialize` wrapped to refuse a `hetero_parallel` config | `integrations/guard.py` `install_deepspeed_guard`, as the one above (the package root asks for both, import_hooks.py runs them before `import deepspeed` returns) | a homogeneous path (stock Trainer, plain Accelerate, plain DeepSpeed) would silently ignore the section | `integrations/guard.py` `remove_deepspeed_guard()`: the original is kept as `__wrapped__` |
| `deepspeed.utils.groups.mpu` pointed at one stage's StageMPU | `topology/mpu.py` `stage_context`, around every stage engine call | DeepSpeed stores the last engine's mpu in that global and ZeRO re-reads it at gradient reduction | restored when the context exits |
| `deepspeed.utils.groups._EXPERT_PARALLEL_GROUP` / `_EXPERT_DATA_PARALLEL_GROUP` (and their `_RANKS`): an entry `ds_hetero.language.ep<N>` | `expert_parallel/zero.py` `register`, when a language stage shards its experts | DeepSpeed reduces expert gradients (ZeRO 0-2) over the group named by each expert parameter's `group_name`, looked up in those process-wide dicts; its own builder is world-shaped | `unregister(name)`; the next engine with ep overwrites the entry, and DeepSpeed reads it only for a module with MoE layers |
| `deepspeed.comm.barrier` / `all_reduce` given no group -> the saving stage's group | `checkpoint/stage_collectives.py` `collectives_on`, around each stage engine's `save_checkpoint` | DeepSpeed's save makes world collectives; a stage saved by ds_hetero's own files (experts over ep) calls no DeepSpeed save, so under disaggregated placement the world ones would not pair | restored when the save returns |
| `transformers` attention registry: `ds_hetero_sequence_sharded` added | `context_parallel/attention.py` `_register`, when a language stage shards its sequence | transformers picks attention kernels by name from a process-wide registry | none needed: the entry is stateless and only the models whose config ds_hetero pointed at it (their own `_attn_implementation`, model state, not process state) call it |
| `transformers` attention registry: `ds_hetero_per_sample_sdpa` and `ds_hetero_per_sample_eager` added | `models/per_sample_attention.py` `_register`, when a packed language stage attends per sample | as above | none needed, as above: only the attention modules whose config copy names them call them, and without `packed_segments` they call the model's own kernel |
"""

from __future__ import annotations

import sys


def _shm_backend_module():
    # The module must be reached through `sys.modules`: `import deepspeed.comm.torch as m` binds
    # the `torch` package instead, because `deepspeed.comm` has an attribute named `torch`.
    import deepspeed.comm.torch  # noqa: F401 - make sure the module is loaded

    return sys.modules["deepspeed.comm.torch"]


def skip_cpu_shm_comm_build() -> None:
    """Stop DeepSpeed from JIT-compiling its shared-memory comm op on the CPU accelerator.

    Why: on CPU, `deepspeed.comm.torch.TorchBackend.__init__` calls `build_shm_op()`, which
    compiles `deepspeed_shm_comm` with ninja/g++ at every start of a fresh cache (45-65 s). The
    op only serves DeepSpeed's inference all-reduce, which training never uses. On other
    accelerators the function is left alone.
    """
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return
    backend_module = _shm_backend_module()
    if getattr(backend_module.build_shm_op, "_ds_hetero_skipped", False):
        return
    original = backend_module.build_shm_op

    def _no_shm_op():
        return None

    _no_shm_op._ds_hetero_skipped = True
    _no_shm_op.__wrapped__ = original
    backend_module.build_shm_op = _no_shm_op


def restore_cpu_shm_comm_build() -> None:
    backend_module = _shm_backend_module()
    if getattr(backend_module.build_shm_op, "_ds_hetero_skipped", False):
        backend_module.build_shm_op = backend_module.build_shm_op.__wrapped__
