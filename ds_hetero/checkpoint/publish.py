"""Publishing a checkpoint atomically: nothing under its final name until every rank has written.

    1. every rank writes under DIR/.<tag>.partial/ (its stages' DeepSpeed files; the stage's
       first rank adds params.json; rank 0 the manifest)
    2. one all-reduce over all ranks: the barrier, carrying any rank's write error to all
    3. rank 0 renames DIR/.<tag>.partial -> DIR/<tag> (one rename of a directory: atomic)
    4. rank 0 writes DIR/latest.tmp and renames it over DIR/latest (atomic)
    5. barrier

A kill at any moment leaves `latest` naming the previous complete checkpoint: before 3 the new
one has no final name; between 3 and 4 it exists whole but is not yet `latest`. A leftover
`.partial` folder is removed by the next save of the same tag. Saving a tag that exists but is
not `latest` replaces it; the tag `latest` names is refused (its replacement could not be atomic).

Kill points for tests: DS_HETERO_CHECKPOINT_KILL="<point>:<rank>" makes that rank SIGKILL itself
when it reaches `point` (see POINTS); no sleeps or timing involved.
"""

from __future__ import annotations

import os
import shutil
import signal

KILL_ENV = "DS_HETERO_CHECKPOINT_KILL"
POINTS = (
    "begin",            # the partial folder exists, nothing written by this rank
    "stage_written",    # this rank wrote its first stage's files, not yet its second (colocated)
    "rank_written",     # this rank wrote everything; other ranks may still be writing
    "before_rename",    # rank 0, after the barrier: every file complete, nothing published
    "before_latest",    # rank 0: DIR/<tag> complete, `latest` still names the previous one
)


def kill_point(point: str, rank: int) -> None:
    """SIGKILL this process if DS_HETERO_CHECKPOINT_KILL names this point and rank (test hook)."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    want, _, want_rank = spec.partition(":")
    if want not in POINTS:
        raise ValueError(f"{KILL_ENV}={spec!r}: unknown point {want!r}; one of {', '.join(POINTS)}")
    if want == point and int(want_rank or 0) == rank:
        os.kill(os.getpid(), signal.SIGKILL)


def partial_dir(save_dir: str, tag: str) -> str:
    return os.path.join(save_dir, f".{tag}.partial")


def clear_partial(save_dir: str, tag: str) -> str:
    path = partial_dir(save_dir, tag)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(save_dir: str, tag: str, rank: int) -> None:
    """Steps 3 and 4 (rank 0 only, after the barrier)."""
    kill_point("before_rename", rank)
    final = os.path.join(save_dir, tag)
    old = os.path.join(save_dir, f".{tag}.replaced")
    if os.path.exists(final):  # an older or unpublished folder of this tag (never the one `latest` names)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(partial_dir(save_dir, tag), final)
    shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(save_dir)
    kill_point("before_latest", rank)
    tmp = os.path.join(save_dir, "latest.tmp")
    with open(tmp, "w") as f:
        f.write(tag)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(save_dir, "latest"))
    _fsync_dir(save_dir)
