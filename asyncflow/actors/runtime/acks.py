"""Acks that ride on the next request: a role that put its outputs for a batch acks
the batch inside its next GetBatch of the same task (``ack=``, one round trip less
per unit of work) instead of with a separate Ack.

The rows stay handed to the role until then. If its process dies first, the
launcher's requeue acks the rows whose outputs are already in the queue
(``Requeue.done_columns``) and returns only the others: finished work is never
redone, so a rollout response already scored downstream is never replaced.
``flush`` acks everything still pending at once: the loop calls it before it
answers Pause (a checkpoint must see every finished row acked) and on Stop.
"""

from __future__ import annotations


class DeferredAcks:
    def __init__(self, tq):
        self.tq = tq
        self._pending: dict[str, list[int]] = {}  # task -> finished rows not yet acked

    def add(self, batch) -> None:
        """``batch`` (a TQClient Batch) is done: ack it with the next request."""
        self.add_rows(batch.task, batch.indices)

    def add_rows(self, task: str, indices) -> None:
        """Rows ``indices`` of ``task`` are done: ack them with the next request."""
        if len(indices):
            self._pending.setdefault(task, []).extend(indices)

    def take(self, task: str) -> list[int]:
        """The rows to pass as ``ack=`` of the next GetBatch of ``task`` (now the caller's to ack)."""
        return self._pending.pop(task, [])

    def flush(self) -> None:
        pending, self._pending = self._pending, {}
        for task, indices in pending.items():
            self.tq.ack(task, indices)
