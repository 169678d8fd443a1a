"""ActivityClock: the time accounting of one role, shared by loop actors (``runtime/loop.py``)
and trainer ranks (``trainer/rank.py``).

Time is accounted per activity (``with clock.activity("generate")``); an activity
called ``wait_*`` counts as waiting (``wait_s[*]``), any other as busy. ``stats`` may
be called from any thread (GetRoleStats is answered on the listener thread) and
counts the activity in progress up to that moment. With a tracer, every activity is
a span, and finer parts (``core/phases.py``) of the role's own thread are spans
``<activity>/<phase>``, never busy or idle time.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import TYPE_CHECKING

from asyncflow.actors.runtime import messages
from asyncflow.core import phases

if TYPE_CHECKING:
    from asyncflow.actors.runtime.spans import SpanRecorder


class ActivityClock:
    def __init__(self, role: str, version: Callable[[], int]):
        self.role = role
        self._version = version  # the role's policy version, for stats and the trace's counter
        self.busy_s = 0.0
        self.wait_s: dict[str, float] = {}
        self.state = "idle"  # the activity in progress, or what the role says it is doing
        self._running: tuple[str, float] | None = None  # (activity, its start) in progress
        self._lock = threading.Lock()
        self.tracer: SpanRecorder | None = None  # once the role starts working

    def start_tracing(self, collector) -> None:
        """Spans go to ``collector`` from now on; phases of the calling thread too."""
        if self.tracer is not None:
            return
        from asyncflow.actors.runtime.spans import SpanRecorder

        self.tracer = tracer = SpanRecorder(self.role, collector)
        if tracer.enabled:
            phases.set_sink(self._phase_sink(threading.get_ident()))

    @contextmanager
    def activity(self, name: str):
        """Account the time of the block to ``name`` (``wait_*`` counts as waiting)."""
        previous, self.state = self.state, name
        start = time.monotonic()
        outer, self._running = self._running, (name, start)
        try:
            yield
        finally:
            elapsed = time.monotonic() - start
            with self._lock:
                self._running = outer
                if name.startswith("wait_"):
                    key = name.removeprefix("wait_")
                    self.wait_s[key] = self.wait_s.get(key, 0.0) + elapsed
                else:
                    self.busy_s += elapsed
            if self.tracer is not None:
                self.tracer.span(self.role, name, start, elapsed)
                self.tracer.counters["version"] = self._version()
            self.state = previous

    def add_wait(self, key: str, seconds: float) -> None:
        """Count ``seconds`` spent outside any activity as waiting for ``key``."""
        with self._lock:
            self.wait_s[key] = self.wait_s.get(key, 0.0) + seconds

    def _phase_sink(self, thread_id: int):
        def sink(name: str, start: float, duration_s: float) -> None:
            if self.tracer is not None and threading.get_ident() == thread_id and self._running is not None:
                self.tracer.span(self.role, f"{self._running[0]}/{name}", start, duration_s)

        return sink

    def stats(self, num_items: int, state: str | None = None) -> messages.RoleStats:
        """Cumulative times, the activity in progress included up to now (any thread)."""
        with self._lock:
            busy_s, wait_s, running = self.busy_s, dict(self.wait_s), self._running
        if running is not None:
            name, start = running
            if name.startswith("wait_"):
                key = name.removeprefix("wait_")
                wait_s[key] = wait_s.get(key, 0.0) + time.monotonic() - start
            else:
                busy_s += time.monotonic() - start
        return messages.RoleStats(
            role=self.role,
            busy_s=busy_s,
            wait_s=wait_s,
            version=self._version(),
            num_items=num_items,
            state=state or self.state,
            pid=os.getpid(),
        )

    def close(self) -> None:
        if self.tracer is not None:
            self.tracer.close()
