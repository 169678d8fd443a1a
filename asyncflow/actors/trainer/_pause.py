"""Pausing a role for a checkpoint when its process may die and be restarted meanwhile.

A reference names an address, and a restarted process registers the same name at a
new one. An ask to the dead address is never refused (nng keeps redialling a peer
that is gone and holds the request for it), so one long ask would wait out its whole
timeout while the restarted process, which starts unpaused, is never asked. Found by
the chaos suite: a worker killed while the trainer checkpointed left the trainer
blocked for 600 s.

``pause_role`` asks in short rounds instead. After each round that gets no answer it
looks the name up again, and asks the new address if the name moved. Pause is
idempotent, so a slow but live role that gets the question twice answers twice and
stays paused. A name not in the directory at all (its dead instance unregistered by the
driver's requeue, its restart not registered yet) is looked up again the same way. Only
when the whole ``deadline_s`` passes without an answer does it raise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from asyncflow.actors.runtime import messages
from asyncflow.core.errors import ActorGone, ActorTimeout
from asyncflow.core.ref import ActorRef

log = logging.getLogger(__name__)

POLL_S = 5.0
"""How long one round waits for Paused before the name is looked up again."""


def pause_role(
    lookup: Callable[[str], ActorRef], name: str, deadline_s: float = 600.0, poll_s: float = POLL_S
) -> tuple[ActorRef, messages.Paused]:
    """Pause ``name``; returns the reference that answered (to Resume later) and its Paused.

    ``lookup(name)`` gives a fresh reference from the directory, which names the
    newest process registered under ``name``. Raises ``ActorTimeout`` when nothing
    answers within ``deadline_s``.
    """
    deadline = time.monotonic() + deadline_s
    ref = _registered(lookup, name, deadline, deadline_s, poll_s)
    while True:
        wait_s = max(0.1, min(poll_s, deadline - time.monotonic()))
        try:
            return ref, ref.ask(messages.Pause(), timeout_s=wait_s)
        except (ActorTimeout, ActorGone) as exc:
            if time.monotonic() >= deadline:
                raise ActorTimeout(name, ref.address, "Pause", deadline_s) from exc
            if isinstance(exc, ActorGone):
                time.sleep(min(poll_s, 0.5))  # refused at once: give its restart a moment to register
        try:
            newer = lookup(name)
        except LookupError as exc:  # unregistered (a stop, or a restart in progress): ask again where it was
            log.info("pause %s: not in the directory now (%s); asking again", name, exc)
            continue
        if newer.address != ref.address:
            log.warning("pause %s: it moved from %s to %s (restarted); asking the new process", name, ref.address, newer.address)
            ref = newer


def _registered(lookup: Callable[[str], ActorRef], name: str, deadline: float, deadline_s: float, poll_s: float) -> ActorRef:
    """``lookup(name)``, again every ``min(poll_s, 0.5)`` s while the name is not registered
    (a restart in progress), until ``deadline``; then ``ActorTimeout``."""
    said = False
    while True:
        try:
            return lookup(name)
        except LookupError as exc:
            if time.monotonic() >= deadline:
                raise ActorTimeout(name, "(not in the directory)", "Pause", deadline_s) from exc
            if not said:
                log.info("pause %s: not in the directory (%s); looking again until it registers (a restart)", name, exc)
                said = True
        time.sleep(min(poll_s, 0.5))


def pause_roles(
    lookup: Callable[[str], ActorRef],
    names: Sequence[str],
    paused: list[ActorRef],
    pool: Executor,
    deadline_s: float = 600.0,
    poll_s: float = POLL_S,
) -> dict[str, bytes]:
    """Pause every role of ``names`` at once (``pause_role`` each, on ``pool``); their
    resumable states by role. Together, because the roles that take longest are those
    whose process is restarting, and a killed process can hold many (packed replicas):
    asked one after the other, each would cost its own rounds.

    Every reference that answered is appended to ``paused``, in the order of ``names``,
    even when another role fails, so that the caller resumes it; then the first failure
    (in that order) is raised, once every pause has finished."""
    futures = [pool.submit(pause_role, lookup, name, deadline_s, poll_s) for name in names]
    states: dict[str, bytes] = {}
    failure: BaseException | None = None
    for future in futures:
        try:
            ref, answer = future.result()
        except Exception as exc:  # noqa: BLE001  (raised below, once the others are listed for resume)
            failure = failure or exc
            continue
        paused.append(ref)
        states[answer.role] = answer.state
    if failure is not None:
        raise failure
    return states
