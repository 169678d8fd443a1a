"""The gateway's side of a checkpoint and a resume (``[rollout.gateway] train``): pure
state, no HTTP, no queue.

A checkpoint saves the queue while every role is paused; the gateway's rewards are
written to the queue from its HTTP threads, not between units, so the replica's pause
also holds them (``WriteHold``): the write in flight finishes, later ones wait until the
checkpoint resumes the roles. What the replica saves with the checkpoint is the set of
session ids written to the queue so far (``covered``): exactly the sessions the saved
queue accounts for, trained (or dropped as stale) before it or held in it.

A resume restores the queue of that checkpoint; the sessions written after it are lost
from the queue, though their clients were told ``written``. The journal still has
them: ``to_replay`` gives the units (groups, lone sessions) to write again, each
session once by id: those the journal says were written, less the checkpoint's
``covered`` and those written again in this launch already (a replica restarted in
place after writing them). Their tokens of rolled-back versions come back older
(``journal.py``), so they are trained as stale data within the bound, or discarded as
too stale and counted, never taken for the resumed run's own.

Invariant: a session answered ``written`` is in the queue once per launch line of the
journal: covered by the checkpoint, or in ``to_replay`` until this launch writes it
again (at most once: a replica killed mid-write loses those, as any write).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import msgspec

from asyncflow.gateway.journal import Replayed, Written


class SavedState(msgspec.Struct, kw_only=True):
    """What a serving replica saves with a checkpoint (its resumable state)."""

    written: list[str] = []
    """The sessions its gateway wrote to the queue before the checkpoint saved it."""


def encode_state(written: Iterable[str]) -> bytes:
    return msgspec.msgpack.encode(SavedState(written=sorted(written)))


def decode_state(data: bytes) -> set[str] | None:
    """The sessions a checkpoint's queue accounts for; None when it saved none (not a
    checkpoint of a serving replica)."""
    return set(msgspec.msgpack.decode(data, type=SavedState).written) if data else None


def to_replay(state: Replayed, covered: set[str], launch: int) -> list[Written]:
    """The units to write again in launch ``launch`` (module docstring), in journal order."""
    out = []
    for unit in state.written:
        if unit.launch >= launch:  # written in this launch: in its queue
            continue
        keep = [k for k, s in enumerate(unit.sessions) if s not in covered]
        if keep:
            sessions = [unit.sessions[k] for k in keep]
            out.append(Written(sessions, unit.group, [unit.rewards[k] for k in keep], unit.launch))
    return out


class WriteHold:
    """Queue writes held while a checkpoint saves. Every method is called with ``lock``
    held: the gateway's feed lock, which a reward's write holds throughout; a resume's
    write puts without it, between ``started`` and ``finished``."""

    def __init__(self, lock: threading.Lock):
        self._open = threading.Condition(lock)
        self.held = False
        self.num_waiting = 0
        """Writes waiting for the checkpoint now."""
        self._num_putting = 0

    def hold(self) -> None:
        """Hold the writes, once the puts under way are done."""
        self.held = True
        self._open.wait_for(lambda: self._num_putting == 0)

    def started(self) -> None:
        self._num_putting += 1

    def finished(self) -> None:
        self._num_putting -= 1
        self._open.notify_all()

    def release(self) -> None:
        self.held = False
        self._open.notify_all()

    def wait(self, timeout_s: float | None) -> bool:
        """Wait until writes are not held (``timeout_s`` None: however long); whether they are not."""
        self.num_waiting += 1
        try:
            return self._open.wait_for(lambda: not self.held, timeout=timeout_s)
        finally:
            self.num_waiting -= 1
