"""A background sender of tells, so an actor's own thread never waits on a peer.

A tell is acknowledged on receipt (one round trip); an actor that notifies other
actors from its handler would hold up its next message by that much. The notifier
sends from its own thread, in order per target, and ``flush`` waits until
everything queued before it is delivered (before a save).

Notices queued for the same target while the sender was busy are merged into one
message (``merge``): a burst of small writes costs one round trip per controller, not
one per write. A merge never drops a notice's inline cells (``tq/inline.py``): notices
with and without them stay apart. With ``linger_s`` the sender also waits that long
after a first notice for more to merge (for bookkeeping off the critical path: acks,
frees), trading a few milliseconds of delay for far fewer messages.

A notice that gets no receipt is sent again, with the same request id, until it gets
one or ``cluster.transport.freeze_timeout_s`` has passed (``core/retry.py``): a frozen
receiver handles it once when it wakes (``core/replay.py``), and the notices after it
wait meanwhile, so the order per target holds. One that still fails is logged.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from asyncflow.core import protocol, retry
from asyncflow.core.transport import TransportConfig

log = logging.getLogger(__name__)


def merge(a: Any, b: Any) -> Any | None:
    """One message equivalent to ``a`` then ``b`` (same target), or None."""
    if type(a) is not type(b):
        return None
    if isinstance(a, protocol.RowsWritten):
        if a.shard != b.shard or a.columns != b.columns or bool(a.metas) != bool(b.metas):
            return None
        # a notice's inline cells are one list per column, a cell per row: a notice that carries
        # them and one that does not (a big put) cannot be one message without dropping cells, so
        # they go as two (the controller keeps the small put's rows and reads the big one's)
        if a.inline.keys() != b.inline.keys():
            return None
        inline = {name: a.inline[name] + b.inline[name] for name in a.inline}
        return protocol.RowsWritten(
            shard=a.shard, indices=a.indices + b.indices, columns=a.columns, metas=a.metas + b.metas, inline=inline
        )
    if isinstance(a, protocol.RowsAcked):
        return protocol.RowsAcked(task=a.task, indices=a.indices + b.indices) if a.task == b.task else None
    if isinstance(a, protocol.Wake):
        return b if a.incarnation == b.incarnation else None  # the newest wake covers the older
    if isinstance(a, (protocol.FreeRows, protocol.ForgetRows)):
        return type(a)(indices=a.indices + b.indices)
    return None


class Notifier:
    def __init__(
        self, owner: str, resolve: Callable[[str], Any], linger_s: float = 0.0, transport: TransportConfig | None = None
    ):
        transport = transport or TransportConfig.from_env()
        # a flush waits as long as a notice is sent again to a frozen receiver, and a little more
        self._flush_timeout_s = transport.freeze_timeout_s + transport.ask_timeout_s
        self._owner = owner
        self._linger_s = linger_s
        self._resolve = resolve  # actor name -> ActorRef (resolved in the sender thread)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"notify-{owner}", daemon=True)
        self._thread.start()

    def tell(self, name: str, msg: Any) -> None:
        self._queue.put((name, msg))

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until everything told so far is delivered (at most ``timeout_s``; None:
        as long as a notice is sent again to a frozen receiver, and a little more)."""
        if timeout_s is None:
            timeout_s = self._flush_timeout_s
        done = threading.Event()
        self._queue.put((None, done))
        if not done.wait(timeout_s):
            raise TimeoutError(f"{self._owner}: notifications not delivered within {timeout_s:g} s")

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop sending (what is still queued is dropped: the owner is stopping)."""
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            if self._linger_s > 0 and items[0] is not None and items[0][0] is not None:
                deadline = time.monotonic() + self._linger_s
                while (left := deadline - time.monotonic()) > 0:
                    try:
                        item = self._queue.get(timeout=left)
                    except queue.Empty:
                        break
                    items.append(item)
                    if item is None or item[0] is None:  # close or flush: no more waiting
                        break
            while True:  # take whatever else queued up meanwhile
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            batch: list[list] = []  # [name, msg] in order, merged per target
            last: dict[str, list] = {}
            for item in items:
                if item is None:
                    self._send(batch)
                    return
                name, msg = item
                if name is None:  # a flush marker: everything before it goes first
                    self._send(batch)
                    batch, last = [], {}
                    msg.set()
                    continue
                prev = last.get(name)
                merged = merge(prev[1], msg) if prev is not None else None
                if prev is not None and merged is not None:
                    prev[1] = merged
                else:
                    entry = [name, msg]
                    batch.append(entry)
                    last[name] = entry
            self._send(batch)

    def _send(self, batch: list[list]) -> None:
        for name, msg in batch:
            if self._closed:
                return
            try:
                retry.tell(self._resolve(name), msg)
            except Exception as exc:  # a sender thread must outlive a bad peer; say so loudly
                log.error("%s: could not tell %s to %s: %s: %s", self._owner, type(msg).__name__, name, type(exc).__name__, exc)
