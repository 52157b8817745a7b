"""Which rank of a failed step died: heartbeats in the default process group's store.

When a collective fails, a survivor knows only that some peer stopped answering. Reports
(failures.py) name a rank that raised; a rank that was killed leaves none, and neither does a
survivor still blocked in a collective with a live peer (with expert parallelism a rank's
groups often do not include the dead one, so it learns of the failure only when another
survivor exits). Telling the dead from the blocked needs something a blocked rank still does:
each rank's `Liveness` thread bumps a counter in the store every `interval` seconds (torch's
collectives release the GIL while they wait, so a blocked rank keeps beating), and a survivor
reads every peer's counter twice, `2 * interval` apart: a counter that did not move is a dead
rank. The first survivor that names one publishes the verdict in the store; every rank's thread
keeps the last verdict it read, so a survivor that fails later, after the store's host (rank 0
under `env://`) has gone, still names the dead rank.

One thread per engine, stopped when the engine is collected or the store stops answering; one
small store write and one read per rank and `interval`.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref

import torch.distributed as dist

from .failures import default_store

INTERVAL_S = 1.0
_PREFIX = "ds_hetero/alive"


class Liveness:
    """This rank's heartbeat and its view of the others' (keys under `group_name`, unique per engine)."""

    def __init__(self, group_name: str, rank: int, owner: object, interval: float = INTERVAL_S):
        self.rank, self.interval = rank, interval
        self._key = f"{_PREFIX}/{group_name}"
        self._verdict: str | None = None  # the last published verdict this rank's thread read
        self._stop = threading.Event()
        store = default_store()
        if store is None:
            return
        owner_ref = weakref.ref(owner)  # the thread must not keep the engine alive
        self._thread = threading.Thread(target=self._beat, args=(store, owner_ref),
                                        name=f"ds_hetero-liveness-{rank}", daemon=True)
        self._thread.start()
        # stopped before the interpreter tears down: a daemon thread inside a store call then could abort it
        atexit.register(self.stop)

    def _beat(self, store, owner_ref) -> None:
        beat_key, verdict_key = f"{self._key}/{self.rank}", f"{self._key}/verdict"
        while not self._stop.is_set() and owner_ref() is not None and dist.is_initialized():
            try:
                store.add(beat_key, 1)
                if store.check([verdict_key]):
                    self._verdict = store.get(verdict_key).decode(errors="replace")
            except Exception:  # noqa: BLE001 - the store's host is gone: nothing more to learn
                return
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        thread = getattr(self, "_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2 * self.interval)

    @property
    def verdict(self) -> str | None:
        return self._verdict

    def dead_ranks(self, ranks) -> list[int] | None:
        """The ranks of `ranks` whose heartbeat did not move over `2 * interval` (None: the store
        cannot be read). Blocks for that long."""
        store = default_store()
        if store is None:
            return None
        try:
            before = [store.add(f"{self._key}/{r}", 0) for r in ranks]
            time.sleep(2 * self.interval)
            after = [store.add(f"{self._key}/{r}", 0) for r in ranks]
        except Exception:  # noqa: BLE001 - the store's host died
            return None
        return [r for r, b, a in zip(ranks, before, after) if a == b]

    def publish(self, text: str) -> None:
        """Tell the ranks that fail later which rank died (read by their threads)."""
        store = default_store()
        try:
            if store is not None:
                store.set(f"{self._key}/verdict", text)
        except Exception:  # noqa: BLE001 - best effort
            pass
