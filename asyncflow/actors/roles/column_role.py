"""ColumnRole: the easy base for a custom RL role that reads some columns of each
row and writes one more (a judge, a learned reward model, a tool-use checker).

Subclass it and implement ``score``; name it in the config::

    [[roles]]
    name = "judge"
    cls = "my_module:MyJudge"       # importable: see [cluster] python_path
    task = "judge"                  # its own queue task: it sees every row once
    reward_column = "judge_score"   # the trainer adds it to the reward
    kwargs = { batch_size = 16 }

Each unit takes up to ``batch_size`` rows of ``task`` whose ``inputs`` are produced,
calls ``score`` and puts ``output`` (one float32 per row), then acks them (with its
next request, ``runtime/acks.py``).

Takes: the LoopActor messages (StartWork, Pause, Resume, GetRoleStats, Stop).
Invariant: every row gets exactly one score (the queue hands a row to a task once).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from asyncflow.actors.runtime.acks import DeferredAcks
from asyncflow.actors.runtime.loop import LoopActor
from asyncflow.actors.runtime.run_dir import Run
from asyncflow.core import protocol
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.errors import BatchTimeout


class ColumnRole(LoopActor):
    acks: DeferredAcks  # made in __init__ (the base class allows None)
    inputs: Sequence[str] = ("response_ids",)
    """Columns the role needs (they must be produced before a row is handed to it)."""

    def __init__(self, ctx, run_dir: str, task: str, output: str, batch_size: int = 16):
        super().__init__(ctx)
        self.run = Run(run_dir)
        self.task = task
        self.output = output
        self.batch_size = batch_size
        self.tq = TQClient(ctx.directory, consumer=ctx.name)
        self.acks = DeferredAcks(self.tq)

    def score(self, columns: dict[str, list[np.ndarray]], metas: list[protocol.RowMeta]) -> list[float]:
        """One float per row; ``columns[name][k]`` is column ``name`` of row k."""
        raise NotImplementedError(f"{type(self).__name__} must implement score()")

    def work_once(self) -> bool:
        with self.activity("wait_data"):
            try:
                batch = self.tq.get_batch(
                    self.task, list(self.inputs), self.batch_size, partial=True, ack=self.acks.take(self.task)
                )
                if len(batch) == 0:
                    batch = self.tq.get_batch(self.task, list(self.inputs), 1, timeout_s=0.5)
            except BatchTimeout:
                return True
        with self.activity("score"):
            scores = self.score(batch.columns, batch.metas)
            if len(scores) != len(batch):
                raise ValueError(f"{type(self).__name__}.score returned {len(scores)} values for {len(batch)} rows")
        with self.activity("put"):
            self.tq.put(batch.indices, {self.output: [np.asarray([s], dtype=np.float32) for s in scores]})
        self.acks.add(batch)  # acked inside the next request
        self.num_items += len(batch)
        return True
