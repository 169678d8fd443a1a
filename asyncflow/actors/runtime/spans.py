"""SpanRecorder: what a role does over time, cheaply, sent to the collector.

``span`` appends to in-memory lists (no I/O, no lock beyond the GIL); a daemon
thread flushes them to the collector every ``flush_s`` as one ``Spans`` tell. Spans
never travel through the data plane. The collector writes them as a Chrome trace
(RUN_DIR/trace.json) at the end of the run.

Each span carries the policy version the role held when it began (the ``version``
counter the loop sets after every span); the version at a span's end is the next
span's, or the counter at flush time for the last one. The collector draws the
weight-sync flows from them.

Every tell also carries ``cpu_s``, the CPU seconds of the whole process so far (all
its threads), first taken when the recorder starts (the role's work starts): the
collector draws it as a "cpu" counter, ``afctl bench e2e --breakdown`` divides its
growth by the steps. A flush tells only when there is something new (spans, a changed
counter), or when ``keepalive_s`` has passed since the last tell, and ``close`` always
does: a role inside one long generate call (minutes at full scale) costs the collector
a tell per keepalive, not one per ``flush_s`` from every role.

Switched off with ``[logging] spans = false`` (the driver sets ASYNCFLOW_SPANS=0 in
every process): ``span`` then returns at once and nothing is sent.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from asyncflow.actors.runtime import messages

log = logging.getLogger(__name__)

SPANS_ENV = "ASYNCFLOW_SPANS"


def spans_enabled() -> bool:
    return os.environ.get(SPANS_ENV, "1") != "0"


KEEPALIVE_S = 10.0
"""A recorder with nothing new still tells the collector its process's CPU this often."""


class SpanRecorder:
    def __init__(
        self, role: str, collector_ref, flush_s: float = 0.5, enabled: bool | None = None, keepalive_s: float = KEEPALIVE_S
    ):
        self.role = role
        self.keepalive_s = keepalive_s
        self._said: dict[str, float] | None = None  # the counters of the last tell but cpu_s (None: none yet)
        self._said_at = 0.0  # monotonic time of the last tell
        self.enabled = spans_enabled() if enabled is None else enabled
        self._ref = collector_ref
        self._spans: list[tuple[str, float, float, int]] = []  # name, start (wall s), duration s, version
        self.counters: dict[str, float] = {"cpu_s": time.process_time()}  # this process's CPU seconds so far
        self._offset = time.time() - time.monotonic()  # monotonic -> wall clock
        self._stop = threading.Event()
        self._thread = None
        if self.enabled:
            self._thread = threading.Thread(target=self._run, args=(flush_s,), name=f"spans-{role}", daemon=True)
            self._thread.start()

    def span(self, role: str, name: str, start_monotonic: float, duration_s: float) -> None:
        if not self.enabled:
            return
        self._spans.append((name, start_monotonic + self._offset, duration_s, int(self.counters.get("version", -1))))

    def flush(self, force: bool = False) -> None:
        """Tell the collector the spans since the last tell and the counters, if there is news
        (or ``force``, or the keepalive is due)."""
        if not self.enabled:
            return
        spans, self._spans = self._spans, []  # one swap, atomic under the GIL: no span is lost or torn
        self.counters["cpu_s"] = time.process_time()
        counters = {k: v for k, v in self.counters.items() if k != "cpu_s"}
        now = time.monotonic()
        if not (force or spans or counters != self._said or now - self._said_at >= self.keepalive_s):
            return
        self._said, self._said_at = counters, now
        names, starts, durations, versions = (list(column) for column in zip(*spans)) if spans else ([], [], [], [])
        try:
            self._ref.tell(
                messages.Spans(
                    role=self.role,
                    pid=os.getpid(),
                    names=names,
                    starts_s=starts,
                    durations_s=durations,
                    counters=dict(self.counters),
                    versions=versions,
                ),
                timeout_s=2.0,
            )
        except Exception as exc:  # tracing must never stop a role; the collector may be gone at exit
            log.debug("spans of %s dropped: %s", self.role, exc)

    def _run(self, flush_s: float) -> None:
        while not self._stop.wait(flush_s):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self.flush(force=True)
