"""The trainer's take of gateway sessions (``[rollout.gateway] train``): the run's rows
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
(``stale``); they are audited in trained.jsonl (``stale_sessions``) and counted
(``sessions_stale``).

Invariant: a session's row is handed to the trainer at most once (the controller's
consumed bit), and is either trained (its index in a step's ``indices``) or dropped as
stale (in ``stale_sessions``), never both.
"""

from __future__ import annotations

from asyncflow.config.names import TASK_TRAIN
from asyncflow.core import protocol
from asyncflow.core.tq.errors import BatchTimeout


def fresh(step: int, k: int) -> list[protocol.RowFilter]:
    """The rows step ``step`` may train on: version >= step - k."""
    return [protocol.RowFilter(field="version", lo=step - k)]


def discard_stale(tq, step: int, k: int) -> list[int]:
    """Ack, untrained, the ready sessions older than step ``step`` may train on."""
    if step - k - 1 < 0:
        return []
    return tq.discard(TASK_TRAIN, [protocol.RowFilter(field="version", hi=step - k - 1)])


def request(tq, step: int, k: int, columns: list[str], batch_size: int, dp_size: int, ack: list[int]):
    """One GetBatch of ``batch_size`` fresh session rows in whole groups (acking
    ``ack``); None if not enough are ready within 1 s."""
    try:
        return tq.get_meta(
            TASK_TRAIN,
            columns,
            batch_size,
            policy="group",
            dp_size=dp_size,
            filters=fresh(step, k),
            timeout_s=1.0,
            ack=ack,
        )
    except BatchTimeout:
        return None


def stale_warning(step: int, cfg, discarded: int, total: int) -> str:
    """What a step that discarded stale sessions tells the user: they do not count toward
    ``num_sessions``, so a client that sent all its sessions at once waits forever."""
    k = cfg.staleness
    return (
        f"step {step} discarded {discarded} gateway sessions older than version {step - k} ({total} so far): "
        f"a session trains only within workflow.staleness = {k} steps of the version it was sampled with, and a "
        "discarded one does not count toward [rollout.gateway] num_sessions. The run now waits for newer sessions: "
        "keep the agent sending, send sessions no faster than the run trains, or raise workflow.staleness"
    )
