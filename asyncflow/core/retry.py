"""Requests that outlive a frozen peer: sent again, with the same id, until answered.

A peer that does not answer in time is frozen (SIGSTOP, Ctrl-Z of the run, a
debugger, a swapped-out or GC-paused process) or dead. A frozen one answers when it
wakes, so failing the caller (and with it the run) at the first timeout is wrong.
``ask`` and ``tell`` here send a request, and again each time an attempt gets no
answer, until one does or ``cluster.transport.freeze_timeout_s`` has passed; then
they raise ``PeerFrozen``. A dead peer is the driver's business: it restarts the
process (or stops the run), and a frozen one past the freeze timeout it kills and
restarts the same way (``actors/driver/_freezes.py``).

Every copy of one request carries the same id (the sending thread's id and its
request number, in the frame's header), and the peer serves the request once,
answering every copy with that answer (``core/replay.py``): a request that hands
something out (a queue's GetBatch, Allocate) stays exactly-once however many copies
the peer finds in its socket when it wakes.

One attempt waits ``wait_s`` (how long the peer may hold the request on purpose: a
get's poll, an allocation waiting for room) plus ``cluster.transport.ask_timeout_s``.
An answer that is an error (``RemoteError``) is raised at once, as is a broken
connection (``ActorGone``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from asyncflow.core import protocol
from asyncflow.core.errors import ActorTimeout, PeerFrozen
from asyncflow.core.ref import ActorRef

log = logging.getLogger(__name__)

R = TypeVar("R")

_ids = threading.local()


def next_id() -> tuple[str, int]:
    """A new request id of this thread: (the thread's sender id, its next request number).
    A thread waits for one request at a time, so a higher number tells the peer the
    thread is done with the older ones (``core/replay.py``)."""
    sender = getattr(_ids, "sender", None)
    if sender is None:
        sender = _ids.sender = uuid.uuid4().hex[:16]
        _ids.seq = 0
    _ids.seq += 1
    return sender, _ids.seq


def ask(
    ref: ActorRef,
    msg: protocol.Request[R],
    wait_s: float = 0.0,
    *,
    ask_timeout_s: float | None = None,
    freeze_timeout_s: float | None = None,
) -> R:
    """Ask ``msg`` of ``ref`` until it is answered, every copy with the same request id
    (see the module's docstring); raises ``PeerFrozen`` after ``wait_s`` +
    ``freeze_timeout_s`` without an answer, ``RemoteError`` or ``WrongReply`` on an
    answer that is an error. ``ask_timeout_s``, ``freeze_timeout_s``: None for the
    transport's; a ``freeze_timeout_s`` of 0 sends once (``ActorTimeout``)."""

    def attempt(timeout_s: float, sender: str, seq: int) -> R:
        return ref.ask(msg, timeout_s, sender=sender, seq=seq)

    return _until_answered(ref, type(msg).__name__, attempt, wait_s, ask_timeout_s, freeze_timeout_s, True)


def ask_idempotent(
    ref: ActorRef,
    msg: protocol.Request[R],
    wait_s: float = 0.0,
    *,
    ask_timeout_s: float | None = None,
    freeze_timeout_s: float | None = None,
) -> R:
    """``ask`` for a request that may be served twice (a read): the copies carry no id,
    so the peer keeps no answer for them (a large read's stays out of its memory)."""

    def attempt(timeout_s: float, _sender: str, _seq: int) -> R:
        return ref.ask(msg, timeout_s)

    return _until_answered(ref, type(msg).__name__, attempt, wait_s, ask_timeout_s, freeze_timeout_s, False)


def tell(ref: ActorRef, msg: Any, *, freeze_timeout_s: float | None = None) -> None:
    """Deliver ``msg`` to ``ref`` once, sending it again until its receipt comes (a
    notice that matters: the queue's RowsWritten, RowsAcked, FreeRows...); raises
    ``PeerFrozen`` after ``freeze_timeout_s`` (None: the transport's)."""

    def attempt(timeout_s: float, sender: str, seq: int) -> None:
        ref.tell(msg, timeout_s, sender=sender, seq=seq)

    _until_answered(ref, type(msg).__name__, attempt, 0.0, None, freeze_timeout_s, True)


def _until_answered(
    ref: ActorRef,
    what: str,
    attempt: Callable[[float, str, int], R],
    wait_s: float,
    ask_timeout_s: float | None,
    freeze_timeout_s: float | None,
    with_id: bool,
) -> R:
    config = ref.config
    freeze_s = config.freeze_timeout_s if freeze_timeout_s is None else freeze_timeout_s
    attempt_s = wait_s + (config.ask_timeout_s if ask_timeout_s is None else ask_timeout_s)
    sender, seq = next_id() if with_id else ("", 0)
    started = time.monotonic()
    deadline = started + wait_s + freeze_s
    num_sent = 0
    while True:
        num_sent += 1
        try:
            timeout_s = attempt_s if num_sent == 1 else max(0.001, min(attempt_s, deadline - time.monotonic()))
            reply = attempt(timeout_s, sender, seq)
        except ActorTimeout:
            now = time.monotonic()
            if freeze_s <= 0:
                raise  # sent once, as asked
            if now >= deadline:
                raise PeerFrozen(ref.name, ref.address, what, now - started, freeze_s) from None
            if num_sent == 1:
                log.warning(
                    "%s at %s has not answered %s for %.0f s: sending it again until it does (a frozen process answers "
                    "when it wakes; after cluster.transport.freeze_timeout_s = %g s this fails)",
                    ref.name,
                    ref.address,
                    what,
                    now - started,
                    freeze_s,
                )
            else:
                log.info("%s: %s sent again (%d copies, %.0f s)", ref.name, what, num_sent, now - started)
            continue
        if num_sent > 1:
            log.warning("%s answered %s after %.0f s and %d copies", ref.name, what, time.monotonic() - started, num_sent)
        return reply
