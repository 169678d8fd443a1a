"""ReplayCache: an actor serves each resendable request once, however often it comes.

A caller that gets no answer in time sends the request again (``core/retry.py``):
its peer may be frozen (SIGSTOP, a debugger, a swapped-out process) rather than
dead. Every copy of one request carries the same id, ``(sender, seq)``: the sending
thread's id and its request number, which grows by one per request of that thread.
When the peer wakes it finds every copy in its socket; it must serve the request
once (a queue's GetBatch hands rows out: served twice, the rows of the first answer
would be lost to the caller, which reads only the last) and answer each copy with
that one answer.

Per sender the cache keeps its newest request: while it is served, the copies that
come meanwhile wait with it and get its answer; once answered, the answer is kept
and sent again to a later copy. A sender waits for one request at a time, so a
request with a higher ``seq`` means it is done with the older ones, whose answer
is dropped then. A copy of an older request than the newest is refused (nobody
reads it). At most ``max_senders`` senders are kept, the least recently seen
dropped first.

Invariant: for one ``(sender, seq)`` the actor's handler runs at most once while
the sender is in the cache, and every copy of it gets the same reply frame.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

NEW = "new"
"""``begin``: a request not seen before; serve it, then call ``answered``."""
ANSWERED = "answered"
"""``begin``: a copy of a request already answered; send the returned frame."""
WAITING = "waiting"
"""``begin``: a copy of a request still being served; it gets the answer with the first."""
STALE = "stale"
"""``begin``: a copy of an older request than the sender's newest; nobody reads its answer."""

MAX_SENDERS = 4096


class _Entry:
    __slots__ = ("seq", "frame", "waiting")

    def __init__(self, seq: int):
        self.seq = seq
        self.frame: bytes | bytearray | None = None
        self.waiting: list[Any] = []  # reply contexts of the copies that came while it was served


class ReplayCache:
    def __init__(self, max_senders: int = MAX_SENDERS):
        self.max_senders = max_senders
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.num_replayed = 0  # copies answered from the cache or with the first

    def begin(self, sender: str, seq: int, ctx: Any) -> tuple[str, bytes | bytearray | None]:
        """What to do with a request ``(sender, seq)`` that came on reply context ``ctx``:
        ``(NEW, None)``, ``(ANSWERED, frame)``, ``(WAITING, None)`` (``ctx`` is kept and
        handed back by ``answered``) or ``(STALE, None)``."""
        with self._lock:
            entry = self._entries.get(sender)
            if entry is not None:
                self._entries.move_to_end(sender)
                if seq < entry.seq:
                    return STALE, None
                if seq == entry.seq:
                    self.num_replayed += 1
                    if entry.frame is not None:
                        return ANSWERED, entry.frame
                    entry.waiting.append(ctx)
                    return WAITING, None
            self._entries[sender] = _Entry(seq)
            self._entries.move_to_end(sender)
            while len(self._entries) > self.max_senders:
                self._entries.popitem(last=False)
            return NEW, None

    def answered(self, sender: str, seq: int, frame: bytes | bytearray) -> list[Any]:
        """Keep ``frame``, the answer to ``(sender, seq)``; returns the reply contexts
        of the copies that waited for it (the caller sends ``frame`` on each)."""
        with self._lock:
            entry = self._entries.get(sender)
            if entry is None or entry.seq != seq:  # the sender moved on (or was dropped): nobody waits
                return []
            entry.frame = frame
            waiting, entry.waiting = entry.waiting, []
            return waiting

    def __len__(self) -> int:
        return len(self._entries)
