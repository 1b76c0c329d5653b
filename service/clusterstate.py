"""The cluster's jobs as the dashboard shows them: fetched by one background thread, served from its last answer.

The sweeps table polls every 2 s and needs no token; a request that asked Ray Jobs itself would wait as long as
a slow or hung cluster does, and enough of them would hold every worker thread of the server (every other
request then waits too). Here no request waits on the cluster: one thread asks it every `every_s` (each
request bounded by service.jobs' timeouts), and requests read the last answer, marked stale when it is old.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from service import jobs

EVERY_S = 5.0  # between two questions to the cluster
STALE_AFTER = 3  # answers older than this many intervals (or none yet) are marked stale


class ClusterState:
    """The last answer of Ray Jobs about the sweeps it runs, refreshed in the background."""

    def __init__(self, address: str, fetch: Callable[[str], list] = jobs.status, every_s: float = EVERY_S) -> None:
        self.address, self._fetch, self.every_s = address, fetch, every_s
        self._jobs: dict = {}
        self._at: float | None = None  # time.monotonic() of the last answer
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def latest(self) -> tuple[dict, bool]:
        """(jobs by sweep id, stale): never waits on the cluster (the first call starts the poller)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._poll, name="ddpsweep-cluster-state", daemon=True)
                self._thread.start()
            age = None if self._at is None else time.monotonic() - self._at
            return dict(self._jobs), age is None or age > STALE_AFTER * self.every_s

    def _poll(self) -> None:
        while True:
            try:
                answer = {s.sweep_id: s for s in self._fetch(self.address)}
            except Exception:  # noqa: BLE001 — an unreachable cluster leaves the last answer, which turns stale
                answer = None
            if answer is not None:
                with self._lock:
                    self._jobs, self._at = answer, time.monotonic()
            time.sleep(self.every_s)
