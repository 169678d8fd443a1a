"""SpanRecorder: what a role does over time, cheaply, sent to the collector.

``record`` appends to in-memory lists (no I/O, no lock beyond the GIL); a daemon
thread flushes them to the collector every ``flush_s`` as one ``Spans`` tell. Spans
never travel through the data plane. The collector writes them as a Chrome trace
(RUN_DIR/trace.json) at the end of the run.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from asyncflow.core import protocol

log = logging.getLogger(__name__)


class SpanRecorder:
    def __init__(self, role: str, collector_ref, flush_s: float = 0.5):
        self.role = role
        self._ref = collector_ref
        self._names: list[str] = []
        self._starts: list[float] = []
        self._durations: list[float] = []
        self.counters: dict[str, float] = {}
        self._offset = time.time() - time.monotonic()  # monotonic -> wall clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(flush_s,), name=f"spans-{role}", daemon=True)
        self._thread.start()

    def span(self, role: str, name: str, start_monotonic: float, duration_s: float) -> None:
        self._names.append(name)
        self._starts.append(start_monotonic + self._offset)
        self._durations.append(duration_s)

    def flush(self) -> None:
        names, starts, durations = self._names, self._starts, self._durations
        self._names, self._starts, self._durations = [], [], []  # swapped atomically under the GIL
        if not names and not self.counters:
            return
        try:
            self._ref.tell(protocol.Spans(role=self.role, pid=os.getpid(), names=names, starts_s=starts,
                                          durations_s=durations, counters=dict(self.counters)), timeout_s=2.0)
        except Exception as exc:  # tracing must never stop a role; the collector may be gone at exit
            log.debug("spans of %s dropped: %s", self.role, exc)

    def _run(self, flush_s: float) -> None:
        while not self._stop.wait(flush_s):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self.flush()
