"""Dynamic sampling in the trainer's take path (``algorithm.dynamic_sampling``, DAPO).

The loader allocates ``RunConfig.groups_per_step`` prompt groups for step s (more
than ``train.prompts_per_step``), the rollout and the scorers process them like any
others, and the trainer takes every row of step s from the queue as usual (the
queue's ``group`` policy, ``min_step = max_step = s``), once all their columns are in.
Only then is a group known to be uninformative, so the filter is here, between the
take and the training: rank 0 reads the step's score columns, keeps the informative
groups (``algorithms/dynamic_sampling.py``), splits the kept groups into the ranks'
parts, and the trainer trains on those alone.

Invariants:
- exactly-once: every row of step s is either trained at step s or dropped at step s
  (``filtered``: equal rewards; ``surplus``: informative beyond the batch); both kinds
  are acked with the step's rows and written to the step's line of trained.jsonl;
- staleness and step numbering are untouched: a step still consumes exactly the rows
  planned for it, so the loader's capacity bound, the rollout's staleness gate
  (s <= v + k) and the trainer's step counter see the same steps as without the
  filter; only more rows per step flow through them.
"""

from __future__ import annotations

import msgspec

from asyncflow.actors._policy import PolicyUpdate
from asyncflow.algorithms.dynamic_sampling import GroupChoice, choose_groups
from asyncflow.core import protocol
from asyncflow.core.tq.balance import balanced_parts
from asyncflow.core.tq.client import TQClient


class Filtered(msgspec.Struct, kw_only=True, frozen=True):
    """The step's batch after the filter: ``meta`` holds the kept rows only (with one
    part per rank); ``dropped`` the indices of the other rows; ``figures`` the metrics."""

    meta: protocol.BatchMeta
    choice: GroupChoice
    dropped: list[int]
    figures: dict[str, float]


def filter_groups(tq: TQClient, policy: PolicyUpdate, meta: protocol.BatchMeta, num_groups: int, num_ranks: int) -> Filtered:
    """Keep up to ``num_groups`` informative groups of the step's rows ``meta`` (all of
    the step's groups, whole), as a batch split into ``num_ranks`` parts."""
    columns = tq.read_batch(meta, policy.score_columns)
    shaped = policy.shaped_rewards(columns).tolist()
    group_ids = [m.group_id for m in meta.metas]
    choice = choose_groups(group_ids, shaped, num_groups, num_ranks)
    kept = set(choice.kept)
    keep = [p for p, g in enumerate(group_ids) if g in kept]
    dropped = [meta.indices[p] for p, g in enumerate(group_ids) if g not in kept]
    num_loaded = len(choice.kept) + len(choice.filtered) + len(choice.surplus)
    raw = policy.rewards(columns)
    figures = {
        "filtered_frac": len(choice.filtered) / num_loaded,
        "kept_groups": float(len(choice.kept)),
        "filtered_groups": float(len(choice.filtered)),
        "surplus_groups": float(len(choice.surplus)),
        "padded_groups": float(len(choice.padded)),
        "sampled_reward_mean": float(raw.mean()),
    }
    return Filtered(meta=subset(meta, keep, num_ranks), choice=choice, dropped=dropped, figures=figures)


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
