"""The step shape of a step streamed in parts (``workflow.stream_step``).

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asyncflow.actors.trainer.sources.base import Batch, StepContext, StepSource, Trained
from asyncflow.actors.trainer.sources.whole import POLL_S
from asyncflow.config.names import TASK_TRAIN
from asyncflow.core import protocol
from asyncflow.core.phases import phase
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.errors import BatchTimeout

if TYPE_CHECKING:
    from asyncflow.config.run import RunConfig


class StreamedStep(StepSource):
    key = "workflow.stream_step"

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self._parts: StreamParts | None = None  # the step whose parts are coming in
        self._done: StreamParts | None = None  # the step whose last part is in, until its optimizer step

    @classmethod
    def wanted(cls, cfg: RunConfig) -> bool:
        return cfg.workflow.stream_step

    @classmethod
    def refusals(cls, cfg: RunConfig) -> Sequence[tuple[bool, str]]:
        """What a step streamed in parts cannot do (yet): each names the key to change."""
        from asyncflow.algorithms.loss_configs import FixedKL

        alg = cfg.algorithm
        return (
            (
                cfg.workflow.mode != "async",
                'needs workflow.mode = "async" (sync mode generates the whole batch before training): set it, or set '
                "workflow.stream_step = false",
            ),
            (cfg.train.num_ranks > 1, "runs on one trainer rank: set train.num_ranks = 1 or workflow.stream_step = false"),
            (alg.epochs > 1, "takes one optimizer step per batch: set algorithm.epochs = 1 or workflow.stream_step = false"),
            (
                not alg.estimator.group_local,
                f"needs advantages within prompt groups (grpo, rloo); algorithm.name = {alg.name!r} normalises over the "
                "whole batch: choose grpo or rloo, or set workflow.stream_step = false",
            ),
            (alg.kl_ctrl != FixedKL(), "measures the KL of a whole batch for the adaptive controller: use a fixed kl_coef"),
        )

    def take(self, step: int) -> Batch | None:
        """The next part of the step's rows (whole groups), trained at once (forward and
        backward); the whole step once its last part is trained, else None."""
        ctx = self.ctx
        cfg = ctx.run.config
        parts = self._parts
        if parts is None:
            rows = cfg.rows_per_step
            parts = self._parts = StreamParts(
                step, rows, part_min_rows(cfg.train.engine.micro_batch_size, cfg.algorithm.group_size, rows)
            )
            ctx.policy.begin_parts(rows)
        with ctx.activity("wait_data"):
            meta = parts.request(ctx.tq, ctx.columns, ctx.acks.take(TASK_TRAIN))
        if meta is None:
            return None  # no part within the wait: the next unit asks again
        integrity = ctx.check_versions(meta)
        mine = list(range(len(meta.indices)))
        with ctx.activity("read"):
            columns = ctx.tq.read_batch(meta, ctx.columns, mine)
        with ctx.activity("train"):
            ctx.policy.train_part(columns, [m.group_id for m in meta.metas], [m.version for m in meta.metas], step)
        parts.add(meta, columns, integrity)
        if parts.remaining > 0:
            return None
        self._parts, self._done = None, parts
        return Batch(meta=parts.meta(), integrity=dict(parts.integrity), started=parts.started)

    def train(self, step: int, batch: Batch) -> Trained:
        """The step's optimizer step: its parts' gradients are in."""
        parts, self._done = self._done, None
        assert parts is not None, "train() follows the take() that returned the step's last part"
        with self.ctx.activity("train"):
            values = self.ctx.policy.finish_parts()
            with phase("figures"):
                figures = self.ctx.policy.batch_figures(parts.columns)
        return Trained(parts=batch.meta.parts, columns=parts.columns, values=values, figures=figures)


def part_min_rows(micro_batch_size: int, group_size: int, rows: int) -> int:
    """The fewest rows worth a part: one micro-batch, rounded up to whole prompt groups,
    at most the step's ``rows``."""
    groups = -(-max(micro_batch_size, 1) // group_size)
    return min(groups * group_size, rows)


@dataclass
class StreamParts:
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
        rest of the step); None when none came within ``POLL_S``."""
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
                timeout_s=POLL_S,
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
