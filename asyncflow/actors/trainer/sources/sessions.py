"""The step shape of gateway sessions (``[rollout.gateway] train``): the run's rows
come from outside, planned for no step (``step`` -1), so a step takes whichever
sessions are ready instead of the rows the loader planned for it.

Step s asks the train task for ``samples_per_step`` rows in whole groups (a keyed
session group of ``algorithm.group_size``, or a lone session, a group of one) whose
version v satisfies ``s - v <= k``: the staleness rule of rollout rows, as a filter
(``version >= s - k``). A session's version is its oldest model token's, and the
trainer's per-token check (``_versions.token_staleness``) and digest check
(``VersionLedger``) apply to its rows as to any.

A session too old for step s is too old for every later step: before each request the
step discards (acks without training) the ready sessions with ``version < s - k``
(``stale``); they are audited in trained.jsonl (``stale_sessions``, their ids in
``stale_session_ids``) and counted (``sessions_stale``). A step's line of trained.jsonl
names the session of each row it trained (``sessions``, in ``indices``' order): row
indices are reused (after a resume too), session ids are what a client was told.

A run whose agents stopped sending ends (``[rollout.gateway] idle_end_s``): once the
trainer has waited that long with no row arriving in the train task and no step taken,
it sets ``ended`` and the trainer saves and ends the run before its last step, saying why.

Invariant: a session's row is handed to the trainer at most once (the controller's
consumed bit), and is either trained (its index in a step's ``indices``) or dropped as
stale (in ``stale_sessions``), never both.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from asyncflow.actors.trainer.sources.base import StepContext
from asyncflow.actors.trainer.sources.whole import WholeStep
from asyncflow.config.names import TASK_TRAIN
from asyncflow.core import protocol

if TYPE_CHECKING:
    from asyncflow.config.run import RunConfig

log = logging.getLogger(__name__)


class GatewaySessions(WholeStep):
    key = "rollout.gateway.train"

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self._stale: list[int] = []  # discarded since the last step's batch
        self._stale_ids: list[str] = []  # their session ids
        self._num_stale = 0
        self._num_trained = 0
        self._idle_since: float | None = None  # the trainer waits for sessions since (monotonic)
        self._seen: tuple[int, int] | None = None  # the train task's rows then (known, acked)

    @classmethod
    def wanted(cls, cfg: RunConfig) -> bool:
        return cfg.data_from_gateway

    @classmethod
    def refusals(cls, cfg: RunConfig) -> Sequence[tuple[bool, str]]:
        return (
            (
                cfg.algorithm.needs_critic,  # sessions get GRPO in groups and RLOO alone (algorithms/session_baseline.py)
                f"a run that trains on gateway sessions cannot do this: algorithm.name = {cfg.algorithm.name!r} trains a "
                "critic: set algorithm.name = 'grpo'",
            ),
        )

    def take(self, step: int):
        batch = super().take(step)
        if batch is None:
            self._check_idle(step)
        else:
            self._idle_since = None
        return batch

    def _check_idle(self, step: int) -> None:
        """End the run (``ended``) once no row arrived and no step was taken for
        ``idle_end_s`` (not with ``until_stopped``, which waits by design)."""
        cfg = self.ctx.run.config
        gw = cfg.rollout.gateway
        if gw.idle_end_s is None or gw.until_stopped:
            return
        status = self.ctx.tq.task_status(TASK_TRAIN)
        seen, now = (status.num_rows, status.num_acked), time.monotonic()
        if self._idle_since is None or seen != self._seen:  # rows arrived (or were freed): not idle
            self._idle_since, self._seen = now, seen
            return
        if now - self._idle_since >= gw.idle_end_s:
            left = status.num_rows - sum(status.num_pending.values()) - status.num_acked
            self.ended = (
                f"no rewarded session reached the queue for {gw.idle_end_s:g} s ([rollout.gateway] idle_end_s): the "
                f"agents stopped sending. Saved after step {step} of {cfg.train.num_steps} ({self._num_trained} "
                f"sessions trained, {self._num_stale} discarded as stale, {left} left in the queue, fewer than a "
                f"step's {self.rows_per_step}); `afctl up --resume` goes on from here once agents send again"
            )

    def before_request(self, step: int) -> None:
        """Sessions too old for this step are too old for any later one: acked untrained."""
        cfg = self.ctx.run.config
        discarded = discard_stale(self.ctx.tq, step, cfg.staleness)
        if discarded.indices:
            self._stale += discarded.indices
            self._stale_ids += discarded.keys
            log.warning(stale_warning(step, cfg, len(discarded.indices), self._num_stale + len(self._stale)))

    @property
    def rows_per_step(self) -> int:
        return self.ctx.run.config.samples_per_step

    def rows_of(self, step: int) -> dict:
        """Sessions are planned for no step: a step's are those fresh enough for it."""
        return {"filters": fresh(step, self.ctx.run.config.staleness)}

    def taken(self, step: int, meta: protocol.BatchMeta, prefetched: bool, started: float):
        batch = super().taken(step, meta, prefetched, started)
        assert batch is not None
        stale, self._stale = self._stale, []
        self._num_stale += len(stale)
        self._num_trained += len(meta.indices)
        batch.audit["sessions"] = [m.key for m in meta.metas]
        batch.audit["stale_sessions"] = stale
        batch.audit["stale_session_ids"], self._stale_ids = self._stale_ids, []
        batch.figures["sessions_stale"] = float(self._num_stale)
        batch.figures["sessions_trained"] = float(self._num_trained)
        batch.figures["sessions_stale_frac"] = self._num_stale / (self._num_stale + self._num_trained)
        return batch


def fresh(step: int, k: int) -> list[protocol.RowFilter]:
    """The rows step ``step`` may train on: version >= step - k."""
    return [protocol.RowFilter(field="version", lo=step - k)]


def discard_stale(tq, step: int, k: int) -> protocol.Discarded:
    """Ack, untrained, the ready sessions older than step ``step`` may train on."""
    if step - k - 1 < 0:
        return protocol.Discarded(indices=[])
    return tq.discard(TASK_TRAIN, [protocol.RowFilter(field="version", hi=step - k - 1)])


def stale_warning(step: int, cfg, discarded: int, total: int) -> str:
    """What a step that discarded stale sessions tells the user: they do not count toward
    ``num_sessions``, so a client that sent all its sessions at once waits forever."""
    k = cfg.staleness
    return (
        f"step {step + 1} discarded {discarded} gateway sessions older than version {step - k} ({total} so far): "
        f"a session trains only within workflow.staleness = {k} steps of the version it was sampled with, and a "
        "discarded one does not count toward [rollout.gateway] num_sessions. The run now waits for newer sessions: "
        "keep the agent sending, send sessions no faster than the run trains, or raise workflow.staleness"
    )
