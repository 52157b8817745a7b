"""Run a function on N local processes joined by a process group, with a hard timeout.

    from ds_hetero.testing.launch import run_distributed
    results = run_distributed(check_fn, world_size=4, timeout=120, some_arg=1)

`check_fn(rank, world_size, *args, **kwargs)` runs on every rank after the default process
group is up; its return values come back as a list indexed by rank. A child that raises makes
the call fail with that child's traceback; a child that hangs or dies is killed at the
deadline. No process outlives the call. The tests and the benchmarks share this launcher.

Children are forked from a forkserver that has imported torch/deepspeed/transformers once, so
a launch costs a fraction of a second instead of the several seconds of a fresh interpreter,
and no child inherits OpenMP state from the pytest process. On CPU ranks the forkserver also
imports what every engine build would import again in each child (see CPU_PRELOAD). Rendezvous is a FileStore in a
fresh temporary directory, so concurrent test runs never fight over a port.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

PRELOAD = ["torch", "torch.distributed", "deepspeed", "transformers"]
# Imported lazily by the first engine build of every child, so once per rank per launch:
# DeepSpeed's ZeRO optimizer check imports its Muon optimizer, whose torch.compile decorators
# import dynamo and inductor (sympy, networkx: about 1,700 modules, several CPU-seconds per rank,
# most of a 4-rank launch on 2 cores); transformers' modeling base (generation, integrations,
# accelerate: about a second per rank) and the package's engine. Only where the ranks run on
# the CPU (DS_ACCELERATOR=cpu, as the tests and benchmarks set it): on a GPU
# machine the children keep importing them after the fork, where CUDA is set up.
# A name that fails to import is skipped by the forkserver (the child imports it as before).
CPU_PRELOAD = ["deepspeed.runtime.zero.muon.muon_optimizer", "transformers.modeling_utils", "ds_hetero.entry",
               "ds_hetero.testing.parity"]


@dataclass(frozen=True)
class RankFailure:
    """What a rank left instead of a result (with check=False): its traceback, or how it died."""

    rank: int
    message: str


def _context() -> mp.context.BaseContext:
    ctx = mp.get_context("forkserver")
    on_cpu = os.environ.get("DS_ACCELERATOR") == "cpu"
    ctx.set_forkserver_preload(PRELOAD + (CPU_PRELOAD if on_cpu else []))
    return ctx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn, rank, world_size, store_path, port, backend, pg_timeout_s, env, args, kwargs, results):
    try:
        import torch
        import torch.distributed as dist

        # DeepSpeed 0.19's ZeRO calls the renamed all_gather_into_tensor on every step
        warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
        torch.set_num_threads(1)  # N ranks share the cores; more threads only contend
        if backend == "nccl":  # one process per device (recipes/check_gpu.sh)
            torch.cuda.set_device(rank)
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            **(env or {}),
        )
        dist.init_process_group(
            backend=backend,
            init_method=f"file://{store_path}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=pg_timeout_s),
        )
        try:
            value = fn(rank, world_size, *args, **kwargs)
        finally:
            # Leave DeepSpeed's comm wrapper and torch's default group as a fresh process has them.
            if dist.is_initialized():
                dist.destroy_process_group()
        results.put((rank, "ok", value))
    except BaseException:  # noqa: BLE001 - report everything, including SystemExit
        results.put((rank, "error", traceback.format_exc()))


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    timeout: float = 180.0,
    backend: str | None = None,
    pg_timeout_s: float = 60.0,
    grace_s: float = 5.0,
    args: tuple = (),
    env: dict[str, str] | None = None,
    check: bool = True,
    **kwargs: Any,
) -> list[Any]:
    """Run `fn(rank, world_size, *args, **kwargs)` on `world_size` processes; return per-rank results.

    `backend`: gloo unless DS_HETERO_TEST_BACKEND says otherwise (nccl on a GPU machine).
    `env`: more environment variables for every child (set before the process group starts).
    `check`: a failed rank raises AssertionError with every failed rank's traceback; with
    check=False its entry in the returned list is a RankFailure instead (tests that kill a rank
    on purpose read the survivors' results from the same list).

    After the first rank fails, the others get `grace_s` seconds to report their own outcome
    before they are killed (tests of failure handling raise it to see the survivors' errors).
    """
    backend = backend or os.environ.get("DS_HETERO_TEST_BACKEND", "gloo")
    ctx = _context()
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="ds_hetero_dist_") as tmp:
        store_path = os.path.join(tmp, "store")
        port = _free_port()
        procs = [
            ctx.Process(
                target=_child,
                args=(fn, rank, world_size, store_path, port, backend, pg_timeout_s, env, args, kwargs, results),
                daemon=True,
                name=f"rank{rank}",
            )
            for rank in range(world_size)
        ]
        for p in procs:
            p.start()
        try:
            outcome = _collect(procs, results, world_size, timeout, grace_s)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
            for p in procs:
                p.join(timeout=10)
            results.close()
    errors = [f"--- rank {r} ---\n{v}" for r, (s, v) in sorted(outcome.items()) if s == "error"]
    missing = [r for r in range(world_size) if r not in outcome]
    if not check:
        killed = f"rank {{}} did not finish within {timeout:.0f}s (killed)"
        return [RankFailure(r, killed.format(r)) if r not in outcome
                else RankFailure(r, outcome[r][1]) if outcome[r][0] == "error" else outcome[r][1]
                for r in range(world_size)]
    if errors or missing:
        msg = "\n".join(errors)
        if missing:
            msg += f"\nranks {missing} did not finish within {timeout:.0f}s (killed)"
        raise AssertionError(f"distributed run of {fn.__name__} on {world_size} ranks failed:\n{msg}")
    return [outcome[r][1] for r in range(world_size)]


def _collect(procs, results, world_size: int, timeout: float, grace_s: float) -> dict[int, tuple[str, Any]]:
    """Each rank's (status, value) as it reports; after the first failure the others get `grace_s`
    to report their own error (they are likely blocked in a collective with the failed rank)."""
    outcome: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout
    first_error_at = None
    while len(outcome) < world_size:
        now = time.monotonic()
        if now > deadline:
            break
        if first_error_at is not None and now - first_error_at > grace_s:
            break
        try:
            rank, status, value = results.get(timeout=0.2)
            outcome[rank] = (status, value)
            if status == "error" and first_error_at is None:
                first_error_at = time.monotonic()
            continue
        except queue.Empty:
            pass
        for rank, p in enumerate(procs):
            if rank not in outcome and not p.is_alive() and p.exitcode not in (0, None):
                # Died without reporting (signal, os._exit): drain once more, then record.
                try:
                    r, status, value = results.get(timeout=0.5)
                    outcome[r] = (status, value)
                except queue.Empty:
                    outcome[rank] = ("error", f"rank {rank} died with exit code {p.exitcode}")
                if first_error_at is None:
                    first_error_at = time.monotonic()
    return outcome
