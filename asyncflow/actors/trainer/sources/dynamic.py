"""The step shape of dynamic sampling (``algorithm.dynamic_sampling``, DAPO).

The loader allocates ``RunConfig.groups_per_step`` prompt groups for step s (more
than ``train.prompts_per_step``), the rollout and the scorers process them like any
others, and the trainer takes every row of step s from the queue as usual (the
queue's ``group`` policy, ``min_step = max_step = s``), once all their columns are in.
Only then is a group known to be uninformative, so the filter is here, between the
take and the training: rank 0 reads the step's score columns, keeps the informative
groups (``algorithms/dynamic_sampling.py``), splits the kept groups into the ranks'
parts, and the trainer trains on those alone.

Refill (``algorithm.dynamic_sampling_max_rounds = R > 0``, DAPO's "keep sampling until
the batch is full"): a step whose groups hold fewer than ``prompts_per_step``
informative ones tells the loader ``RefillGroups(step, round)``; the loader allocates
another ``groups_per_step`` groups tagged with the same step s, the rollout and the
scorers treat them like any others (step s passes the staleness gate: the trainer
holds version s), and the trainer takes them with the same call as the first round
(every row of step s, all columns in). :class:`StepGather` holds the step's rows over
its rounds; the choice is made over all of them (``algorithms/dynamic_sampling.py``,
``StepGroups``). Before asking for the next round the trainer acks the rows of the
groups of equal rewards no choice can keep, so they are freed while it waits. After R
rounds the step trains on what it has (``refill_short`` = 1).

Invariants:
- exactly-once: every row of step s, of every round, is either trained at step s or
  dropped at step s (``filtered``: equal rewards; ``surplus``: informative beyond the
  batch); both kinds are acked (the released ones between rounds, the others with the
  step's rows) and written to the step's line of trained.jsonl;
- staleness and step numbering are untouched: a step consumes exactly the rows
  planned for it (with refill: its rounds', all tagged step s), so the loader's
  capacity bound, the rollout's staleness gate (s <= v + k) and the trainer's step
  counter see the same steps as without the filter; only more rows per step flow
  through them. A round's rows are generated while the trainer holds version s, so
  refill never adds staleness; in sync mode (k = 0) a round is a whole batch like the
  first, so the whole-batch phases (reward, reference) take it as one.
- no deadlock on capacity: the loader leaves ``RunConfig.refill_headroom_rows`` free
  when it allocates a new step (one round plus the informative rows a step holds back),
  so a round fits once the released rows are freed (actors/roles/prompt_loader.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgspec

from asyncflow.actors.runtime import messages
from asyncflow.actors.trainer.sources.base import Batch, StepContext
from asyncflow.actors.trainer.sources.whole import WholeStep
from asyncflow.algorithms.dynamic_sampling import GroupChoice, StepGroups
from asyncflow.config import names
from asyncflow.config.names import TASK_TRAIN
from asyncflow.core import protocol
from asyncflow.core.tq.balance import balanced_parts
from asyncflow.core.tq.client import TQClient

if TYPE_CHECKING:
    from asyncflow.actors.trainer.policy import PolicyUpdate
    from asyncflow.config.run import RunConfig


class DynamicSampling(WholeStep):
    key = "algorithm.dynamic_sampling"

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self._gather: StepGather | None = None  # the step in progress while a refill round is made

    @classmethod
    def wanted(cls, cfg: RunConfig) -> bool:
        return cfg.algorithm.dynamic_sampling

    @property
    def dp_size(self) -> int:
        return 1  # all of the step's over-sampled rows in one part: the filter splits the kept ones

    def taken(self, step: int, meta: protocol.BatchMeta, prefetched: bool, started: float) -> Batch | None:
        """The step's informative groups, gathered over refill rounds
        (``algorithm.dynamic_sampling_max_rounds``); None while a round is asked for."""
        ctx = self.ctx
        cfg = ctx.run.config
        gather = self._gather or StepGather(step, cfg.train.prompts_per_step, ctx.ranks.num_ranks, cfg.refill_rounds)
        with ctx.activity("read"):
            gather.add(ctx.tq, ctx.policy, meta)
        if gather.wants_refill:
            self._gather = gather
            ctx.acks.add_rows(TASK_TRAIN, gather.release())  # freed while the round is made (the loader's headroom)
            ctx.tell(names.LOADER, messages.RefillGroups(step=step, round=gather.num_refills + 1))
            return None  # the round's rows come through the same take
        self._gather = None
        kept = gather.finish()
        return Batch(
            meta=kept.meta,
            integrity=ctx.check_versions(kept.meta),
            started=started,
            prefetched=prefetched,
            dropped=kept.to_ack,  # acked like trained rows, audited with the step
            figures=kept.figures,
            audit={
                "dropped": kept.dropped,
                "filtered_groups": kept.choice.filtered,
                "surplus_groups": kept.choice.surplus,
                "padded_groups": kept.choice.padded,
            },
        )


class Filtered(msgspec.Struct, kw_only=True, frozen=True):
    """The step's batch after the filter: ``meta`` holds the kept rows only (with one
    part per rank); ``dropped`` the indices of the other rows (of every round), of which
    ``to_ack`` are not acked yet; ``figures`` the metrics."""

    meta: protocol.BatchMeta
    choice: GroupChoice
    dropped: list[int]
    to_ack: list[int]
    figures: dict[str, float]


class StepGather:
    """The rows of one step over its rounds (the first and up to ``max_rounds`` refills)."""

    def __init__(self, step: int, num_groups: int, num_ranks: int, max_rounds: int):
        self.step, self.num_ranks, self.max_rounds = step, num_ranks, max_rounds
        self.groups = StepGroups(num_groups, num_ranks)
        self.metas: list[protocol.BatchMeta] = []
        self.released_rows: list[int] = []  # acked between rounds
        self.reward_sum = 0.0
        self.num_rows = 0
        self.started = time.monotonic()

    def add(self, tq: TQClient, policy: PolicyUpdate, meta: protocol.BatchMeta) -> None:
        """One round's rows (all of the step's rows the queue had, whole groups)."""
        columns = tq.read_batch(meta, policy.score_columns)
        values = policy.filter_values(columns).tolist()  # algorithm.dynamic_sampling_metric
        self.groups.add([m.group_id for m in meta.metas], values)
        raw = policy.rewards(columns)
        self.reward_sum += float(raw.sum())
        self.num_rows += len(meta.indices)
        self.metas.append(meta)

    @property
    def num_refills(self) -> int:
        return len(self.metas) - 1

    @property
    def wants_refill(self) -> bool:
        """Short of informative groups, with refill rounds left."""
        return not self.groups.full and self.num_refills < self.max_rounds

    def release(self) -> list[int]:
        """The rows of the groups no choice can keep (``StepGroups.release``), to ack now."""
        gone = set(self.groups.release())
        rows = [i for meta in self.metas for i, m in zip(meta.indices, meta.metas) if m.group_id in gone]
        self.released_rows += rows
        return rows

    def finish(self) -> Filtered:
        """The step's choice over every round, the kept rows split into the ranks' parts."""
        meta = merged(self.metas)
        choice = self.groups.choice()
        kept = set(choice.kept)
        group_ids = [m.group_id for m in meta.metas]
        keep = [p for p, g in enumerate(group_ids) if g in kept]
        dropped = [meta.indices[p] for p, g in enumerate(group_ids) if g not in kept]
        released = set(self.released_rows)
        num_loaded = len(choice.kept) + len(choice.filtered) + len(choice.surplus)
        figures = {
            "filtered_frac": len(choice.filtered) / num_loaded,
            "kept_groups": float(len(choice.kept)),
            "filtered_groups": float(len(choice.filtered)),
            "surplus_groups": float(len(choice.surplus)),
            "padded_groups": float(len(choice.padded)),
            "sampled_reward_mean": self.reward_sum / self.num_rows,
        }
        if self.max_rounds:
            num_first = len({m.group_id for m in self.metas[0].metas})
            figures.update(
                refill_rounds=float(self.num_refills),
                refill_groups=float(num_loaded - num_first),
                refill_short=float(not self.groups.full),
            )
        return Filtered(
            meta=subset(meta, keep, self.num_ranks),
            choice=choice,
            dropped=dropped,
            to_ack=[i for i in dropped if i not in released],
            figures=figures,
        )


def merged(metas: list[protocol.BatchMeta]) -> protocol.BatchMeta:
    """One batch of the rows of ``metas`` in order (the rounds of a step; no parts)."""
    if len(metas) == 1:
        return metas[0]
    names = set(metas[0].columns)
    inline = bool(names) and all(set(m.columns) == names for m in metas)
    return protocol.BatchMeta(
        task=metas[0].task,
        indices=[i for m in metas for i in m.indices],
        metas=[r for m in metas for r in m.metas],
        shards=[k for m in metas for k in m.shards] if all(m.shards for m in metas) else [],
        columns={name: [c for m in metas for c in m.columns[name]] for name in names} if inline else {},
    )


def subset(meta: protocol.BatchMeta, positions: list[int], num_ranks: int) -> protocol.BatchMeta:
    """The rows of ``meta`` at ``positions`` (whole groups), with ``num_ranks`` parts of
    whole groups and balanced lengths, as the queue's ``dp_size`` split makes them."""
    metas = [meta.metas[p] for p in positions]
    parts: list[list[int]] = []
    if num_ranks > 1:
        units: dict[int, list[int]] = {}
        for k, m in enumerate(metas):
            units.setdefault(m.group_id, []).append(k)
        groups = list(units.values())
        lengths = [sum(max(metas[k].prompt_len, 0) + max(metas[k].response_len, 0) for k in g) for g in groups]
        parts = [sorted(k for u in unit_part for k in groups[u]) for unit_part in balanced_parts(lengths, num_ranks)]
    return protocol.BatchMeta(
        task=meta.task,
        indices=[meta.indices[p] for p in positions],
        metas=metas,
        shards=[meta.shards[p] for p in positions] if meta.shards else [],
        parts=parts,
        columns={name: [col[p] for p in positions] for name, col in meta.columns.items()},
    )
