"""Rewarded sessions into the queue's train task (``[rollout.gateway] train``): pure
state, no HTTP, no engine; the queue client is passed in.

A rewarded session becomes one row of the queue (docs/gateway.md, "Training on
sessions"): ``prompt_ids`` and ``response_ids`` (int64), ``rollout_logp`` (float32, 0 on
context tokens), ``loss_mask`` (uint8, 1 on the model's tokens), ``token_versions``
(int32, each token's policy version), ``finish`` (uint8 [1]) and ``reward`` (float32
[1]), built by ``config/columns.py``'s ``row()``, the table the rollout's rows use too
(the trainer reads a column in one dtype whoever wrote it). Its metadata carries the
oldest model token's version (``version``: the staleness the trainer's rule is applied
to), the digest of that version's weights
(``weights_digest``: the trainer's version check), its lengths and the session's id
(``key``: what trained.jsonl names it by). ``step`` is -1: a
session is planned for no step, the trainer takes whatever sessions are ready and fresh
enough (``actors/trainer/sources/sessions.py``).

Grouping:
- a session rewarded with a group key (the ``X-Group-Id`` header of its requests or the
  reward's ``group`` field) waits in ``SessionFeed`` until ``group_size`` sessions of
  that key are rewarded; the complete group is then allocated as one queue group, so
  the trainer's group-complete policy hands it out whole and GRPO normalises within it.
  More sessions of the key start a new group.
- a session without a key is a group of one: the trainer gives it a baseline of the
  step's other lone sessions (leave-one-out, ``algorithms/session_baseline.py``).

Invariants:
- A row is written once: the feed hands a unit out once (``offer``), and puts it back
  (``restore``) only when its write failed before any row was put.
- A session never rewarded within ``timeout_s`` of its last turn, and a keyed group
  not complete within ``timeout_s`` of its first reward, are dropped and counted
  (``expire``): the queue never holds half a group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asyncflow.config.columns import row
from asyncflow.core.protocol import RowMeta

GROUP_HEADER = "x-group-id"


@dataclass
class Rewarded:
    """One rewarded session, as it goes into the queue."""

    session: str
    row: dict[str, Any]
    """``Trajectory.to_json()`` with its reward."""
    digest: int
    """The weights digest of the row's version (its oldest model token's); 0: unknown."""
    at_s: float


@dataclass
class _Waiting:
    members: list[Rewarded] = field(default_factory=list)
    first_s: float = 0.0


@dataclass
class FeedCounts:
    queued: int = 0
    """Sessions written to the queue."""
    unrewarded: int = 0
    """Sessions dropped: no reward within the timeout of their last turn."""
    group_incomplete: int = 0
    """Sessions dropped: their group did not fill within the timeout."""
    waiting: int = 0
    """Sessions rewarded and waiting for their group now."""

    def as_metrics(self) -> dict[str, float]:
        return {f"gateway/sessions_{k}": float(v) for k, v in self.__dict__.items()}


class SessionFeed:
    def __init__(self, group_size: int, timeout_s: float):
        self.group_size, self.timeout_s = group_size, timeout_s
        self._groups: dict[str, _Waiting] = {}
        self.counts = FeedCounts()

    def offer(self, item: Rewarded, group: str | None) -> list[Rewarded]:
        """The unit ``item`` completes (itself alone without a group key, or its whole
        group), to be written now; [] while its group waits for more."""
        if group is None or self.group_size == 1:
            return [item]
        waiting = self._groups.setdefault(group, _Waiting(first_s=item.at_s))
        waiting.members.append(item)
        if len(waiting.members) < self.group_size:
            self.counts.waiting += 1
            return []
        del self._groups[group]
        self.counts.waiting -= self.group_size - 1
        return waiting.members

    def restore(self, unit: list[Rewarded], group: str | None) -> None:
        """A unit whose write failed before any row was put: the members before the last
        wait again (the last one's reward was refused, its client sends it again)."""
        if group is None or len(unit) < 2:
            return
        self._groups[group] = _Waiting(members=unit[:-1], first_s=unit[0].at_s)
        self.counts.waiting += len(unit) - 1

    def written(self, unit: list[Rewarded]) -> None:
        self.counts.queued += len(unit)

    def expire(self, now_s: float) -> list[Rewarded]:
        """Drop the groups older than the timeout; returns their sessions (counted)."""
        old = [g for g, w in self._groups.items() if now_s - w.first_s > self.timeout_s]
        dropped = [m for g in old for m in self._groups.pop(g).members]
        self.counts.group_incomplete += len(dropped)
        self.counts.waiting -= len(dropped)
        return dropped

    def waiting_groups(self) -> dict[str, list[str]]:
        return {g: [m.session for m in w.members] for g, w in self._groups.items()}


def unit_rows(unit: list[Rewarded], metas: list[RowMeta]) -> tuple[dict[str, list[np.ndarray]], list[RowMeta]]:
    """The queue columns of a unit's sessions and their metadata, on the rows ``metas``
    the queue allocated for them (one group: index, group id and size)."""
    rows, out = [], []
    for item, meta in zip(unit, metas, strict=True):
        r = item.row
        rows.append(
            row(
                prompt_ids=r["prompt_ids"],
                response_ids=r["response_ids"],
                rollout_logp=r["rollout_logp"],
                loss_mask=r["loss_mask"],
                token_versions=r["token_versions"],
                finish=r["finish"] == "stop",
                reward=r["reward"],
            )
        )
        meta.version = r["version"]
        meta.prompt_len = len(r["prompt_ids"])
        meta.response_len = len(r["response_ids"])
        meta.weights_digest = item.digest
        meta.key = item.session  # the row's name in trained.jsonl and in a checkpoint's queue: indices are reused
        out.append(meta)
    columns = {name: [cells[name] for cells in rows] for name in rows[0]} if rows else {}
    return columns, out


def write_unit(tq, unit: list[Rewarded], timeout_s: float) -> list[int]:
    """Allocate one queue group for ``unit`` (waiting at most ``timeout_s`` while the
    queue is full: ``QueueFull``) and put its rows; returns their indices."""
    metas = tq.allocate(1, len(unit), step=-1, timeout_s=timeout_s)
    columns, metas = unit_rows(unit, metas)
    indices = [m.index for m in metas]
    tq.put(indices, columns, metas)
    return indices
