"""StepSource: where a trainer step's rows come from, and how the step trains on them.

The trainer's loop is the same for every step shape (``actor.py``): take the step's
rows, train on them, end the step. What differs is the take, and sometimes the
training: a step of the rows planned for it, a step streamed in parts, a step filtered
by dynamic sampling, a step of gateway sessions. Each shape is a ``StepSource``
subclass in its own module of this package, and one line of ``SOURCES``
(``__init__.py``). A source also declares which config asks for it (``wanted``) and
what it cannot do (``refusals``): the driver refuses such a run before any process
starts (``check_step_shape``).

A source gets the trainer's parts it may use as a ``StepContext``; it keeps its own
state between units (a step's parts, a refill round in progress, a prefetch in flight).

Shape legend: none (row metadata and columns only).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from asyncflow.core import protocol
from asyncflow.core.phases import phase

if TYPE_CHECKING:
    from asyncflow.actors.runtime.acks import DeferredAcks
    from asyncflow.actors.runtime.run_dir import Run
    from asyncflow.actors.trainer.policy import PolicyUpdate
    from asyncflow.actors.trainer.rank import RankGroup
    from asyncflow.config.run import RunConfig
    from asyncflow.core.tq.client import TQClient


@dataclass
class StepContext:
    """The trainer's parts a step source uses (one trainer, rank 0)."""

    run: Run
    tq: TQClient
    policy: PolicyUpdate
    ranks: RankGroup
    acks: DeferredAcks
    columns: list[str]
    """The columns a step trains on (``PolicyUpdate.columns``)."""
    activity: Callable[[str], AbstractContextManager]
    """The trainer's activity clock: ``with activity("read"): ...``."""
    check_versions: Callable[[protocol.BatchMeta], dict[str, float]]
    """Each row's weights digest against its version's (``workflow.verify_weights``)."""
    tell: Callable[[str, object], None]
    """A message to another role, by name (dynamic sampling's refill asks the loader)."""
    name: str
    """The trainer's actor name (for thread names and log lines)."""


@dataclass
class Batch:
    """A step's rows, taken: ready to train (a streamed step's already trained part by part)."""

    meta: protocol.BatchMeta
    """The rows the step trains on, with one part per trainer rank (``meta.parts``)."""
    integrity: dict[str, float]
    """The version checks of its rows (``weights_mismatch``, ``weights_unverified``)."""
    started: float = field(default_factory=time.monotonic)
    """When the step's rows were in hand (``step_time_s`` counts from here)."""
    prefetched: bool = False
    """Its request went out while the step before trained (``_prefetch.py``)."""
    dropped: list[int] = field(default_factory=list)
    """Rows taken but not trained, to ack with the step's rows (dynamic sampling's)."""
    figures: dict[str, float] = field(default_factory=dict)
    """The source's own metrics, added to the step's (``filtered_frac``, ``sessions_stale``, ...)."""
    audit: dict[str, object] = field(default_factory=dict)
    """The source's own fields of the step's line of trained.jsonl."""


@dataclass
class Trained:
    """What training a step gave: this rank's rows and the step's figures."""

    parts: list[list[int]]
    """Positions of ``Batch.meta``'s rows each rank trained (``parts[0]``: this one's)."""
    columns: dict[str, list]
    """This rank's rows' columns."""
    values: dict[str, float]
    """The loss's figures (``PolicyUpdate.train``)."""
    figures: dict[str, float]
    """The batch's figures (rewards, tokens, lengths: ``PolicyUpdate.batch_figures``)."""


class StepSource:
    """One step shape. Subclasses say when a run asks for them and what they refuse,
    and implement ``take`` (and ``train`` where a whole batch's update is not theirs)."""

    key: ClassVar[str] = ""
    """The config key that asks for this shape (empty: the default shape)."""
    ended: str | None = None
    """Set by a source that will have no more data (gateway sessions whose agents stopped
    sending): why. The trainer then saves and ends the run before its last step."""

    def __init__(self, ctx: StepContext):
        self.ctx = ctx

    @classmethod
    def wanted(cls, cfg: RunConfig) -> bool:
        """Whether the run's config asks for this step shape."""
        return False

    @classmethod
    def refusals(cls, cfg: RunConfig) -> Sequence[tuple[bool, str]]:
        """What this shape cannot do: (refused, why and the fix) for each setting."""
        return ()

    def take(self, step: int) -> Batch | None:
        """Step ``step``'s rows once they are in; None while they are not (the
        trainer's next unit asks again, so Pause and Stop are handled meanwhile)."""
        raise NotImplementedError

    def train(self, step: int, batch: Batch) -> Trained:
        """The other ranks train their parts while this one reads and trains its own."""
        ctx, meta = self.ctx, batch.meta
        parts = meta.parts if ctx.ranks.num_ranks > 1 else [list(range(len(meta.indices)))]
        ctx.ranks.train_parts(step, meta, parts, ctx.columns)
        mine = parts[0]
        with ctx.activity("read"):
            columns = ctx.tq.read_batch(meta, ctx.columns, mine)
        with ctx.activity("train"):
            values = ctx.policy.train(
                columns, [meta.metas[p].group_id for p in mine], [meta.metas[p].version for p in mine], step
            )
            with phase("figures"):
                figures = ctx.policy.batch_figures(columns)
        return Trained(parts=parts, columns=columns, values=values, figures=figures)

    def close(self) -> None:
        """Let go of what the source holds (a request in flight)."""
