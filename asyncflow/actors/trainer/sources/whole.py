"""The default step shape: exactly the rows planned for step s, all of them, once every
column of every row is in (the queue's ``group`` policy, ``min_step = max_step = s``),
split into one part of whole prompt groups per trainer rank (``dp_size``).

The request for step s + 1 goes out while step s trains (``_prefetch.py``,
``workflow.prefetch_batch``), so its reply is usually waiting when step s ends. Sources
that take rows by another request (``sessions.py``) or filter them (``dynamic.py``)
subclass this one and keep the prefetch.
"""

from __future__ import annotations

import time

from asyncflow.actors.trainer._prefetch import BatchPrefetch
from asyncflow.actors.trainer.sources.base import Batch, StepContext, StepSource
from asyncflow.config.names import TASK_TRAIN
from asyncflow.core import protocol
from asyncflow.core.tq.errors import BatchTimeout

POLL_S = 1.0
"""How long one request waits in the queue before the trainer's unit ends (so Pause and
Stop are handled between waits)."""


class WholeStep(StepSource):
    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self._prefetch = BatchPrefetch(self.request, ctx.name)

    def take(self, step: int) -> Batch | None:
        """The step's rows, from the request sent while the last step trained if there was
        one; then the next step's request goes out."""
        ctx = self.ctx
        with ctx.activity("wait_data"):
            self.before_request(step)
            meta = self._prefetch.take(step)
            prefetched = meta is not None
            if meta is None:
                meta = self.request(step, ctx.acks.take(TASK_TRAIN))
        if meta is not None and not self._prefetch.pending and self._may_prefetch(step + 1):
            self._prefetch.start(step + 1, ctx.acks.take(TASK_TRAIN))
        if meta is None:
            return None
        return self.taken(step, meta, prefetched, started=time.monotonic())

    def taken(self, step: int, meta: protocol.BatchMeta, prefetched: bool, started: float) -> Batch | None:
        """The batch of the rows a request returned (a subclass filters them here)."""
        return Batch(meta=meta, integrity=self.ctx.check_versions(meta), started=started, prefetched=prefetched)

    def before_request(self, step: int) -> None:
        """Called before each take of step ``step`` (a subclass discards rows here)."""

    def request(self, step: int, ack: list[int]) -> protocol.BatchMeta | None:
        """One GetBatch of ``step``'s rows in whole groups (acking ``ack``); None if not
        all in within ``POLL_S``. Runs in the trainer's thread or in the prefetch's."""
        try:
            return self.ctx.tq.get_meta(
                TASK_TRAIN,
                self.ctx.columns,
                self.rows_per_step,
                policy="group",
                dp_size=self.dp_size,
                timeout_s=POLL_S,
                ack=ack,
                **self.rows_of(step),
            )
        except BatchTimeout:
            return None

    @property
    def rows_per_step(self) -> int:
        """Rows a step takes: those planned for it (over-sampled with dynamic sampling)."""
        return self.ctx.run.config.rows_per_step

    def rows_of(self, step: int) -> dict:
        """Which rows are ``step``'s, as ``get_meta`` arguments: those planned for it."""
        return {"min_step": step, "max_step": step}

    @property
    def dp_size(self) -> int:
        """Parts the queue splits the step's rows into: one per trainer rank."""
        return self.ctx.ranks.num_ranks

    def _may_prefetch(self, step: int) -> bool:
        """Whether ``step``'s request may go out while the step before it trains: not
        after the last step, and not across a checkpoint (the queue is saved with
        no request of the trainer in flight)."""
        cfg = self.ctx.run.config
        if not cfg.workflow.prefetch_batch or step >= cfg.train.num_steps:
            return False
        every = cfg.train.checkpoint_every
        return not (every and step % every == 0)

    def close(self) -> None:
        self._prefetch.close()
