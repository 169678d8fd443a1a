"""A background sender of tells, so an actor's own thread never waits on a peer.

A tell is acknowledged on receipt (one round trip); an actor that notifies other
actors from its handler would hold up its next message by that much. The notifier
sends from its own thread, in order (FIFO over all targets), and ``flush`` waits
until everything queued so far is delivered (before a save).
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

from asyncflow.core.errors import AsyncflowError

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, owner: str, resolve: Callable[[str], Any]):
        self._owner = owner
        self._resolve = resolve  # actor name -> ActorRef (resolved in the sender thread)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"notify-{owner}", daemon=True)
        self._thread.start()

    def tell(self, name: str, msg: Any) -> None:
        self._queue.put((name, msg))

    def flush(self, timeout_s: float = 30.0) -> None:
        done = threading.Event()
        self._queue.put((None, done))
        if not done.wait(timeout_s):
            raise TimeoutError(f"{self._owner}: notifications not delivered within {timeout_s:g} s")

    def close(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            name, msg = item
            if name is None:
                msg.set()
                continue
            try:
                self._resolve(name).tell(msg)
            except (AsyncflowError, LookupError) as exc:
                log.error("%s: could not tell %s to %s: %s", self._owner, type(msg).__name__, name, exc)
