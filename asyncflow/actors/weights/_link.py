"""An emulated uplink for a sender of weight chunks (the ``weights`` actor, a relay), for
benchmarks on one box (``afctl bench fanout --link-mb-s``): there every replica shares the
same cores and memory, so the machine's copies, not a link, set the time to the last
replica, and no fan-out's scaling can show. With a link of ``mb_per_s``, each chunk a
sender serves leaves after the ones before it, at that rate, as on a real network
interface: a sender that serves n copies of a version needs n times as long."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class EmulatedLink:
    def __init__(self, mb_per_s: float, clock: Callable[[], float] = time.monotonic):
        if mb_per_s <= 0:
            raise ValueError(f"an emulated link needs a rate above 0 MB/s, not {mb_per_s}")
        self.bytes_per_s = mb_per_s * 1e6
        self.clock = clock
        self._free_at = 0.0  # when the chunks sent so far have all left
        self._lock = threading.Lock()

    @classmethod
    def of(cls, mb_per_s: float) -> EmulatedLink | None:
        """The link of a config's ``workflow.weight_link_mb_s``: None for 0 (no emulation)."""
        return cls(mb_per_s) if mb_per_s > 0 else None

    def send(self, actor, chunk, pending) -> None:
        """Answer ``pending`` (a request to ``actor``) with ``chunk`` once this link has sent it, in
        ``actor``'s thread, unless it was answered meanwhile; the caller returns ``DEFER``."""
        from asyncflow.core.tensors import nbytes

        def answer() -> None:
            if not pending.done:  # its asker gave up meanwhile
                pending.resolve(chunk)

        actor.call_later(self.delay_s(sum(nbytes(t) for t in chunk.tensors)), answer)

    def delay_s(self, num_bytes: int) -> float:
        """Seconds from now until a chunk of ``num_bytes`` sent now has left (it queues behind the ones before)."""
        with self._lock:
            now = self.clock()
            self._free_at = max(now, self._free_at) + num_bytes / self.bytes_per_s
            return self._free_at - now
