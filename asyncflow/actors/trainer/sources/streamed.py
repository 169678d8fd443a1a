"""One trainer step streamed in parts (``workflow.stream_step``).

Without it the trainer waits until every row of step s is in, then trains them all.
With it, the trainer takes step s's rows as their prompt groups complete (a partial
GetBatch of whole groups, at least ``min_rows`` at a time, or what is left of the
step) and runs each part's forward and backward at once, adding to the gradients
(``PolicyUpdate.train_part``); the optimizer step (``finish_parts``) comes when the
step's last row is in. Training overlaps generation inside the step, so with
``workflow.staleness = 0`` every sample is on-policy, as in sync mode, while the
trainer works on the first groups of a step as the rollout generates the next ones.

The update is the one the whole batch would give: the parts are whole prompt groups
(the estimator's advantages are group-local, ``Estimator.group_local``) and the
gradients are rescaled to the step's real token (or sequence) count at the end.

Shape legend: none (row metadata and columns only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from asyncflow.config.names import TASK_TRAIN
from asyncflow.core import protocol
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.errors import BatchTimeout

REQUEST_WAIT_S = 1.0
"""How long one request for a part waits in the queue before the trainer's unit ends
(so Pause and Stop are handled between waits)."""


def part_min_rows(micro_batch_size: int, group_size: int, rows: int) -> int:
    """The fewest rows worth a part: one micro-batch, rounded up to whole prompt groups,
    at most the step's ``rows``."""
    groups = -(-max(micro_batch_size, 1) // group_size)
    return min(groups * group_size, rows)


@dataclass
class StreamStep:
    """The parts of step ``step`` taken so far."""

    step: int
    rows: int  # the step's rows (samples_per_step)
    min_rows: int
    started: float = 0.0  # when the first part came (time.monotonic)
    indices: list[int] = field(default_factory=list)
    metas: list[protocol.RowMeta] = field(default_factory=list)
    shards: list[int] = field(default_factory=list)
    columns: dict[str, list] = field(default_factory=dict)
    integrity: dict[str, float] = field(default_factory=dict)

    @property
    def remaining(self) -> int:
        return self.rows - len(self.indices)

    def request(self, tq: TQClient, columns: list[str], ack: list[int]) -> protocol.BatchMeta | None:
        """The next part: whole prompt groups of this step, at least ``min_rows`` (or the
        rest of the step); None when none came within ``REQUEST_WAIT_S``."""
        left = self.remaining
        try:
            meta = tq.get_meta(
                TASK_TRAIN,
                columns,
                left,
                policy="group",
                partial=True,
                min_rows=min(self.min_rows, left),
                min_step=self.step,
                max_step=self.step,
                timeout_s=REQUEST_WAIT_S,
                ack=ack,
            )
        except BatchTimeout:
            return None
        return meta if meta.indices else None

    def add(self, meta: protocol.BatchMeta, columns: dict[str, list], integrity: dict[str, float]) -> None:
        """Record a trained part: its rows, their columns and their version checks."""
        if not self.indices:
            self.started = time.monotonic()
        self.indices.extend(meta.indices)
        self.metas.extend(meta.metas)
        self.shards.extend(meta.shards)
        for name, values in columns.items():
            self.columns.setdefault(name, []).extend(values)
        for key, value in integrity.items():
            self.integrity[key] = self.integrity.get(key, 0.0) + value

    def meta(self) -> protocol.BatchMeta:
        """The whole step as one batch (one part: this rank's), for the step's report and audit."""
        return protocol.BatchMeta(
            task=TASK_TRAIN,
            indices=list(self.indices),
            metas=list(self.metas),
            shards=list(self.shards),
            parts=[list(range(len(self.indices)))],
        )
