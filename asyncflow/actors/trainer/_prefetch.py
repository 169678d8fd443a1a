"""BatchPrefetch: the trainer's request for step s + 1's batch, sent while step s trains.

The trainer's GetBatch for a step is a long poll: the queue's controller answers it
once every row of the step has all its columns. Sent only when the previous step is
done, its round trip (the request, the controller's selection, the reply) lies on
the critical path of every async step. The trainer sends it from a background
thread as soon as step s's batch is in hand, so the reply for s + 1 is usually
waiting when step s ends.

What it changes and what it does not:
- the same request (same rows, same filter on the step, same ``dp_size``), only
  earlier; the rows come with the same metadata, so training is unchanged;
- the acks it carries are those pending when it is sent (the rows of step s - 1):
  step s's rows are acked one request later, so the queue holds one step more of
  rows for a moment (``queue.capacity_rows``'s automatic value leaves room for it);
- not sent before a checkpoint (the queue is saved with no request in flight) or
  after the last step; with dynamic sampling, step s's refill rounds are asked for
  by the trainer itself while the request for s + 1 waits;
- an error of the background request (other than the 1 s timeout that means "not
  all in yet") is raised in the trainer's thread when it takes the result, so the
  step fails as if it had made the request itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from asyncflow.core import protocol

TakeFn = Callable[[int, list[int]], "protocol.BatchMeta | None"]
"""(step, rows to ack) -> the step's batch, or None if it is not all in within the poll."""


class BatchPrefetch:
    def __init__(self, take: TakeFn, name: str):
        self._take = take
        self._name = name
        self._thread: threading.Thread | None = None
        self._step = -1
        self._meta: protocol.BatchMeta | None = None
        self._error: BaseException | None = None

    @property
    def pending(self) -> bool:
        return self._thread is not None

    def start(self, step: int, ack: list[int]) -> None:
        """Ask for ``step``'s batch in the background, acking ``ack`` with it."""
        if self._thread is not None:
            raise RuntimeError(f"{self._name}: a prefetch of step {self._step} is still in flight; take it first")
        self._step, self._meta, self._error = step, None, None

        def run() -> None:
            try:
                self._meta = self._take(step, ack)
            except BaseException as exc:  # handed to the trainer's thread by take()
                self._error = exc

        self._thread = threading.Thread(target=run, name=f"{self._name}-prefetch", daemon=True)
        self._thread.start()

    def take(self, step: int) -> protocol.BatchMeta | None:
        """The batch of ``step`` if the request in flight was for it and got it; None if
        none was in flight for it or it timed out (ask again). A request for another
        step (a later one, while a dynamic-sampling refill round of this step is taken)
        stays in flight. Re-raises the request's error."""
        if self._thread is None or self._step != step:
            return None
        thread, self._thread = self._thread, None
        thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        meta, self._meta = self._meta, None
        return meta

    def close(self, timeout_s: float = 5.0) -> None:
        """Wait for the request in flight (bounded by its poll), dropping its result."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
