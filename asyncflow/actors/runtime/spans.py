"""SpanRecorder: what a role does over time, cheaply, sent to the collector.

``span`` appends to in-memory lists (no I/O, no lock beyond the GIL); a daemon
thread flushes them to the collector every ``flush_s`` as one ``Spans`` tell. Spans
never travel through the data plane. The collector writes them as a Chrome trace
(RUN_DIR/trace.json) at the end of the run.

Each span carries the policy version the role held when it began (the ``version``
counter the loop sets after every span); the version at a span's end is the next
span's, or the counter at flush time for the last one. The collector draws the
weight-sync flows from them.

Every flush also sends ``cpu_s``, the CPU seconds of the whole process so far (all
its threads), first taken when the recorder starts (the role's work starts): the
collector draws it as a "cpu" counter, ``afctl bench e2e --breakdown`` divides its
growth by the steps.

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


class SpanRecorder:
    def __init__(self, role: str, collector_ref, flush_s: float = 0.5, enabled: bool | None = None):
        self.role = role
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

    def flush(self) -> None:
        if not self.enabled:
            return
        spans, self._spans = self._spans, []  # one swap, atomic under the GIL: no span is lost or torn
        self.counters["cpu_s"] = time.process_time()
        if not spans and not self.counters:
            return
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
        self.flush()
