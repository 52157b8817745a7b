"""What a failed training step reports: this rank's own error, or which peer stopped.

Two kinds of failure reach the engine's step wrapper (engine.py):
- this rank's own work raised (an autograd error, a model's ValueError, ...): it is re-raised as
  itself, with a note naming the rank, its stages and the step, and a report in the default
  process group's store (`ds_hetero/failed/<group>/<rank>`), written before the rank's process
  exits, so before its peers see its connections close;
- a collective failed (gloo or NCCL saw a peer's connection close, or `timeout_s` passed): the
  rank raises `RuntimeError("ds_hetero: rank R (stages) failed in step S: a peer rank stopped
  answering: ...")`, naming the peer where it can tell: the rank whose report says it raised
  (with its error), else the one rank that left no report while every other one did (it died,
  e.g. killed, or hangs), waiting up to REPORT_WAIT_S for the others' reports.

Whether an exception came from a collective is read from where it was raised: torch's own
`DistError`, or the innermost frame inside `torch/distributed` (gloo raises a plain RuntimeError
from inside the collective's wait). The store is the default group's, the one torch's own
rendezvous uses; where it cannot be read (its host, rank 0 under the `env://` rendezvous, is the
rank that died) the report says which peer is unknown.
"""

from __future__ import annotations

import os
import time

import torch.distributed as dist

REPORT_WAIT_S = 3.0  # how long a survivor waits for the other ranks' reports
_PREFIX = "ds_hetero/failed"


def is_collective_failure(exc: BaseException) -> bool:
    """Whether `exc` was raised by a torch.distributed collective (not by this rank's own work)."""
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"torch{os.sep}distributed{os.sep}" in tb.tb_frame.f_code.co_filename


def default_store():
    """The default process group's store (torch's own rendezvous), or None where it cannot be reached."""
    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):
        return None


def _key(group, rank: int) -> str:
    # the group's name is unique per engine (every rank creates groups in one order), so reports
    # of an earlier engine in the same processes are never read as this one's
    return f"{_PREFIX}/{getattr(group, 'group_name', 'default')}/{rank}"


def _write(group, rank: int, text: str) -> None:
    store = default_store()
    if store is None:
        return
    try:
        store.set(_key(group, rank), text)
    except Exception:  # noqa: BLE001 - the report is best effort: the store's host may be gone
        pass


def _read(group, ranks) -> dict[int, str] | None:
    store = default_store()
    if store is None:
        return None
    out = {}
    try:
        for r in ranks:
            key = _key(group, r)
            if store.check([key]):
                out[r] = store.get(key).decode(errors="replace")
    except Exception:  # noqa: BLE001 - the store's host died with the peer
        return None
    return out


def own_failure(exc: BaseException, group, rank: int, where: str, step: int) -> BaseException:
    """This rank's own error, noted with its rank and step and reported to its peers."""
    _write(group, rank, f"raised {type(exc).__name__} in step {step}: {str(exc)[:500]}")
    exc.add_note(f"ds_hetero: raised on rank {rank} ({where}) by its own work in step {step}")
    return exc


def peer_failure(exc: BaseException, group, ranks, rank: int, where: str, step: int, timeout_s: float,
                 liveness=None) -> RuntimeError:
    """The error of a rank whose collective failed: which peer stopped, where it can tell.
    `liveness` (liveness.py): the engine's heartbeats, which tell a dead rank from one still
    blocked in a collective, and keep a verdict for ranks that fail after the store's host."""
    _write(group, rank, f"saw a peer stop in step {step}")
    others = [r for r in ranks if r != rank]
    deadline = time.monotonic() + REPORT_WAIT_S
    while True:
        reports = _read(group, others)
        raised = {r: t for r, t in (reports or {}).items() if t.startswith("raised")}
        silent = [r for r in others if reports is not None and r not in reports]
        if reports is None or raised or len(silent) <= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    dead = liveness.dead_ranks(silent) if liveness is not None and not raised and len(silent) > 1 else None
    if raised:
        who = "; ".join(f"rank {r} {t}" for r, t in sorted(raised.items()))
    elif reports is not None and len(silent) == 1:
        who = f"rank {silent[0]} left no report (it died, e.g. was killed, or hangs)"
    elif dead:  # the others without a report are blocked in a collective: alive
        who = f"rank{'s' if len(dead) > 1 else ''} {', '.join(map(str, dead))} died (e.g. was killed): " \
              f"{'their heartbeats' if len(dead) > 1 else 'its heartbeat'} stopped"
    elif liveness is not None and liveness.verdict:  # published by a survivor while the store answered
        who = liveness.verdict
    elif silent:
        who = f"no report from ranks {silent} (one of them died or hangs)"
    else:
        who = "which peer is unknown (the ranks' reports could not be read)"
    if liveness is not None and (dead or (reports is not None and len(silent) == 1 and not raised)):
        liveness.publish(who)
    if dist.get_rank() == 0 and reports is not None:
        # rank 0 hosts the env:// store: let the last readers (and the others' heartbeat threads,
        # which keep a published verdict) read before it exits
        time.sleep(0.5 if liveness is None else max(0.5, 1.5 * liveness.interval))
    return RuntimeError(
        f"ds_hetero: rank {rank} ({where}) failed in step {step}: a peer rank stopped answering: {who}. "
        f"(A collective failed: the peer died, raised, or exceeded hetero_parallel.timeout_s = {timeout_s:g} s; "
        f"see that rank's own error.) Cause: {exc}")
