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
  request (``self.acks``, ``runtime/acks.py``) are flushed first.
- Time is accounted per activity (``with self.activity("generate")``, an
  ``ActivityClock``, ``runtime/activity.py``); what is not inside an activity called
  ``wait_*`` counts as busy. GetRoleStats is answered at once on the listener thread
  (not between units), the activity in progress counted up to that moment, so the
  planner reads busy fractions at step boundaries.
- Finer parts of an activity (``core/phases.py``: forward, backward, sampling, queue
  encode...) are spans ``<activity>/<phase>`` in the trace, never busy or idle time.
"""

from __future__ import annotations

import logging
import traceback
from typing import TYPE_CHECKING, ClassVar

import msgspec

from asyncflow.actors.runtime import messages
from asyncflow.actors.runtime.activity import ActivityClock
from asyncflow.config.names import COLLECTOR
from asyncflow.core import protocol
from asyncflow.core.actor import Actor, ActorContext

if TYPE_CHECKING:
    from asyncflow.actors.runtime.acks import DeferredAcks

log = logging.getLogger(__name__)


class _Tick:
    pass


class LoopActor(Actor):
    Inbox = messages.LoopIn
    Urgent: ClassVar[tuple[type, ...]] = (
        messages.GetRoleStats,
    )  # answered at once, mid-unit, with the running activity counted so far

    def __init__(self, ctx: ActorContext):
        super().__init__(ctx)
        self._running = False
        self._paused = False
        self._finished = False
        self.clock = ActivityClock(ctx.name, lambda: self.version)
        self.num_items = 0
        self.acks: DeferredAcks | None = None  # a DeferredAcks (actors/runtime/acks.py) of a role that acks with its next request

    # -- to implement ----------------------------------------------------------------
    def work_once(self) -> bool:
        """Do one unit of work; return False when the role has nothing more to do."""
        raise NotImplementedError

    def resumable_state(self) -> bytes:
        """State to save at a checkpoint (returned in Paused)."""
        return b""

    def on_resume(self) -> None:
        """The checkpoint that paused this role is saved (or failed): before its units go on."""

    @property
    def version(self) -> int:
        return -1

    # -- time accounting (runtime/activity.py) -------------------------------------------------
    def activity(self, name: str):
        """Account the time of the block to ``name`` (``wait_*`` counts as waiting)."""
        return self.clock.activity(name)

    def stats(self) -> messages.RoleStats:
        stats = self.clock.stats(self.num_items, "paused" if self._paused else None)
        counters = self.counters()
        return msgspec.structs.replace(stats, counters=counters) if counters else stats

    def counters(self) -> dict[str, float]:
        """Role-specific running totals reported in RoleStats (none by default)."""
        return {}

    # -- loop --------------------------------------------------------------------------
    def on_stop(self) -> None:
        self.clock.close()

    def handle_urgent(self, msg):
        if isinstance(msg, messages.GetRoleStats):
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
            self.clock.state = "done"
            return
        self._schedule()

    def _report_failure(self, detail: str) -> None:
        report_failure(self.ctx, detail)

    def handle(self, msg, pending):
        match msg:
            case messages.StartWork():
                if self.clock.tracer is None:
                    self.clock.start_tracing(self.ctx.ref(COLLECTOR))
                self._running = True
                self._schedule()
                return protocol.Ok()
            case messages.Pause():
                self._paused = True
                if self.acks is not None:
                    self.acks.flush()  # every finished row acked before the checkpoint looks
                return messages.Paused(role=self.ctx.name, state=self.resumable_state())
            case messages.Resume():
                self.on_resume()
                self._paused = False
                self._schedule()
                return protocol.Ok()
            case messages.SetThreads(num_threads=num_threads):
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


def report_failure(ctx: ActorContext, detail: str) -> None:
    """Tell the collector that the role of ``ctx`` failed (``detail``: the error and traceback)."""
    try:
        ctx.ref(COLLECTOR, wait_s=1.0).tell(messages.RoleFailed(role=ctx.name, error=detail))
    except Exception as exc:  # the collector may be gone at shutdown; the log has it
        log.error("could not report the failure of %s: %s", ctx.name, exc)
