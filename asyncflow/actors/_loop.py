"""LoopActor: the base of every worker role (loader, rollout, reference, reward, trainer).

A worker does its work in units (``work_once``: one generate call, one scored
batch, one train step). Units run in the actor's own thread, one per ``_Tick``
message the actor tells itself, so other messages (Pause, Resume, Stop) are
handled between units, never in the middle of one; GetRoleStats (and the
rollout's WeightsReady) are Urgent: answered at once on the listener thread.

Takes: StartWork, Pause, Resume, GetRoleStats, SetThreads, WeightsReady (rollout), Ping, Stop.
Sends: Paused, RoleStats; RoleFailed to the collector if a unit raises.

Invariants:
- Pause is answered between units, so every row a unit took has been acked or
  put back when Paused is sent (checkpoints rely on it); acks deferred to the next
  request (``self.acks``, ``_acks.py``) are flushed first.
- Time is accounted per activity (``with self.activity("generate")``); what is not
  inside an activity called ``wait_*`` counts as busy. GetRoleStats is answered at
  once on the listener thread (not between units), the activity in progress counted
  up to that moment, so the planner reads busy fractions at step boundaries.
- Finer parts of an activity (``core/phases.py``: forward, backward, sampling, queue
  encode...) are spans ``<activity>/<phase>`` in the trace, never busy or idle time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from contextlib import contextmanager
from typing import TYPE_CHECKING

from asyncflow.core import phases, protocol
from asyncflow.core.actor import Actor, ActorContext

if TYPE_CHECKING:
    from asyncflow.actors._acks import DeferredAcks

log = logging.getLogger(__name__)

COLLECTOR = "collector"


class _Tick:
    pass


class LoopActor(Actor):
    Inbox = protocol.LoopIn
    Urgent = (protocol.GetRoleStats,)  # answered at once, mid-unit, with the running activity counted so far

    def __init__(self, ctx: ActorContext):
        super().__init__(ctx)
        self._running = False
        self._paused = False
        self._finished = False
        self._busy_s = 0.0
        self._wait_s: dict[str, float] = {}
        self._in_activity: tuple[str, float] | None = None  # (activity, its start) in progress
        self._stats_lock = threading.Lock()  # stats are read on the listener thread
        self._state = "idle"
        self.num_items = 0
        self._started_at = time.monotonic()
        self.tracer = None  # a SpanRecorder once the work starts
        self.acks: DeferredAcks | None = None  # a DeferredAcks (actors/_acks.py) of a role that acks with its next request

    # -- to implement ----------------------------------------------------------------
    def work_once(self) -> bool:
        """Do one unit of work; return False when the role has nothing more to do."""
        raise NotImplementedError

    def resumable_state(self) -> bytes:
        """State to save at a checkpoint (returned in Paused)."""
        return b""

    @property
    def version(self) -> int:
        return -1

    # -- time accounting -------------------------------------------------------------
    @contextmanager
    def activity(self, name: str):
        """Account the time of the block to ``name`` (``wait_*`` counts as waiting)."""
        previous, self._state = self._state, name
        start = time.monotonic()
        outer, self._in_activity = self._in_activity, (name, start)
        try:
            yield
        finally:
            elapsed = time.monotonic() - start
            with self._stats_lock:
                self._in_activity = outer
                if name.startswith("wait_"):
                    key = name.removeprefix("wait_")
                    self._wait_s[key] = self._wait_s.get(key, 0.0) + elapsed
                else:
                    self._busy_s += elapsed
            if self.tracer is not None:
                self.tracer.span(self.ctx.name, name, start, elapsed)
                self.tracer.counters["version"] = self.version
            self._state = previous

    def _phase_sink(self, thread_id: int):
        """Phases (``core/phases.py``) of this role's own thread become spans named
        ``<activity>/<phase>``; they count as neither busy nor idle (their activity does)."""
        def sink(name: str, start: float, duration_s: float) -> None:
            if self.tracer is not None and threading.get_ident() == thread_id and self._in_activity is not None:
                self.tracer.span(self.ctx.name, f"{self._in_activity[0]}/{name}", start, duration_s)
        return sink

    def stats(self) -> protocol.RoleStats:
        """Cumulative times, the activity in progress included up to now (any thread)."""
        with self._stats_lock:
            busy_s, wait_s, running = self._busy_s, dict(self._wait_s), self._in_activity
        if running is not None:
            name, start = running
            if name.startswith("wait_"):
                key = name.removeprefix("wait_")
                wait_s[key] = wait_s.get(key, 0.0) + time.monotonic() - start
            else:
                busy_s += time.monotonic() - start
        return protocol.RoleStats(
            role=self.ctx.name, busy_s=busy_s, wait_s=wait_s, version=self.version,
            num_items=self.num_items, state="paused" if self._paused else self._state, pid=os.getpid(),
        )

    # -- loop --------------------------------------------------------------------------
    def on_stop(self) -> None:
        if self.tracer is not None:
            self.tracer.close()

    def handle_urgent(self, msg):
        if isinstance(msg, protocol.GetRoleStats):
            return self.stats()
        return super().handle_urgent(msg)

    def _schedule(self) -> None:
        if self._running and not self._paused and not self._finished:
            self.actor_ref.tell(_Tick())

    def on_receive(self, message):
        if isinstance(message, _Tick):
            self._tick()
            return None
        return super().on_receive(message)

    def _tick(self) -> None:
        if not self._running or self._paused or self._finished:
            return
        try:
            more = self.work_once()
        except Exception as exc:
            self._finished = True
            detail = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            log.error("role %s failed: %s", self.ctx.name, detail)
            self._report_failure(detail)
            return
        if not more:
            self._finished = True
            self._state = "done"
            return
        self._schedule()

    def _report_failure(self, detail: str) -> None:
        try:
            self.ctx.ref(COLLECTOR, wait_s=1.0).tell(protocol.RoleFailed(role=self.ctx.name, error=detail))
        except Exception as exc:  # the collector may be gone at shutdown; the log has it
            log.error("could not report the failure of %s: %s", self.ctx.name, exc)

    def handle(self, msg, pending):
        match msg:
            case protocol.StartWork():
                if self.tracer is None:
                    from asyncflow.actors._spans import SpanRecorder

                    self.tracer = SpanRecorder(self.ctx.name, self.ctx.ref(COLLECTOR))
                    if self.tracer.enabled:
                        phases.set_sink(self._phase_sink(threading.get_ident()))
                self._running = True
                self._schedule()
                return protocol.Ok()
            case protocol.Pause():
                self._paused = True
                if self.acks is not None:
                    self.acks.flush()  # every finished row acked before the checkpoint looks
                return protocol.Paused(role=self.ctx.name, state=self.resumable_state())
            case protocol.Resume():
                self._paused = False
                self._schedule()
                return protocol.Ok()
            case protocol.SetThreads(num_threads=num_threads):
                if num_threads < 1:
                    raise ValueError(f"{self.ctx.name}: SetThreads({num_threads}): use 1 or more threads")
                import torch

                torch.set_num_threads(num_threads)  # process-wide; this thread runs the units
                return protocol.Ok()
            case protocol.Stop():
                self._running = False
                if self.acks is not None:
                    self.acks.flush()
                return protocol.Ok()
            case _:
                raise TypeError(f"{self.ctx.name} does not handle {type(msg).__name__}")
