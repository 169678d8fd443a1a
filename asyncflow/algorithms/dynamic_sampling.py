"""Dynamic sampling (DAPO): which prompt groups of an over-sampled step to train on.

A GRPO group whose responses all got the same reward has advantage 0 on every token:
it adds nothing to the policy gradient, only tokens to the loss's denominator. The
loader over-samples each step (``algorithm.dynamic_sampling_oversample``); once all
of a step's groups are scored, :func:`choose_groups` splits them into

- ``kept``: the informative groups (rewards not all equal), in the order given, up to
  ``num_groups``;
- ``filtered``: the groups of equal rewards (dropped);
- ``surplus``: informative groups beyond ``num_groups`` (dropped);
- ``padded``: groups of equal rewards kept anyway, so that the kept count is a
  positive multiple of ``multiple`` (the trainer ranks: each trains whole groups,
  and every rank needs the same number of them).

The kept count is min(informative, ``num_groups``) rounded down to a multiple of
``multiple``; when that is 0, ``multiple`` groups are kept, informative ones first,
then groups of equal rewards (``padded``: they contribute no gradient, as without
dynamic sampling). Pure: no torch, no I/O.

Refill (``algorithm.dynamic_sampling_max_rounds``): a step short of ``num_groups``
informative groups gets more rounds of groups; :class:`StepGroups` gathers a step's
groups over its rounds and makes the same choice over all of them, in arrival order.
Between rounds it releases the groups of equal rewards that no choice can keep (all
but the first ``multiple``, the only ones padding may take), so their rows can be
freed while the step waits for its next round.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

EQUAL_REWARD_TOL = 1e-6
"""Rewards within this of each other count as equal (float32 in the queue)."""


class GroupChoice(msgspec.Struct, kw_only=True, frozen=True):
    """Group ids, each list in the order the groups were given."""

    kept: list[int]
    filtered: list[int]
    surplus: list[int]
    padded: list[int]


def group_rewards(group_ids: Sequence[int], rewards: Sequence[float]) -> dict[int, list[float]]:
    """Each group's rewards, groups in order of first appearance."""
    out: dict[int, list[float]] = {}
    for group, reward in zip(group_ids, rewards, strict=True):
        out.setdefault(group, []).append(float(reward))
    return out


def is_informative(rewards: Sequence[float], tol: float = EQUAL_REWARD_TOL) -> bool:
    """Whether a group's rewards are not all equal (a non-zero GRPO advantage somewhere)."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > tol


def choose_groups(group_ids: Sequence[int], rewards: Sequence[float], num_groups: int, multiple: int = 1) -> GroupChoice:
    """Split the groups of rows (``group_ids[k]``, reward ``rewards[k]``) as the module
    docstring says."""
    by_group = group_rewards(group_ids, rewards)
    return choose_by_kind(list(by_group), {g for g, r in by_group.items() if is_informative(r)}, num_groups, multiple)


def choose_by_kind(groups: Sequence[int], informative_groups: set[int], num_groups: int, multiple: int = 1) -> GroupChoice:
    """:func:`choose_groups` of ``groups`` (in order), given which are informative."""
    if num_groups < 1 or multiple < 1:
        raise ValueError(f"num_groups ({num_groups}) and multiple ({multiple}) must be >= 1")
    if len(groups) < multiple:
        raise ValueError(f"{len(groups)} groups cannot fill {multiple} trainer ranks with a whole group each")
    informative = [g for g in groups if g in informative_groups]
    constant = [g for g in groups if g not in informative_groups]
    num_kept = min(len(informative), num_groups) // multiple * multiple
    padded: list[int] = []
    if num_kept == 0:
        num_kept = min(len(informative), multiple)
        padded = constant[: multiple - num_kept]
    kept = informative[:num_kept]
    return GroupChoice(
        kept=kept + padded,
        filtered=constant[len(padded) :],
        surplus=informative[num_kept:],
        padded=padded,
    )


class StepGroups:
    """One step's groups over its rounds (refill): :meth:`add` each round's rows, ask
    :attr:`full`, :meth:`release` what no choice keeps before the next round, and
    :meth:`choice` at the end (that of :func:`choose_groups` over every round's rows)."""

    def __init__(self, num_groups: int, multiple: int = 1):
        if num_groups < 1 or multiple < 1:
            raise ValueError(f"num_groups ({num_groups}) and multiple ({multiple}) must be >= 1")
        self.num_groups, self.multiple = num_groups, multiple
        self.groups: list[int] = []  # every group, in arrival order
        self.informative: set[int] = set()
        self.released: set[int] = set()
        self.num_rounds = 0

    def add(self, group_ids: Sequence[int], rewards: Sequence[float]) -> None:
        """One round's rows (``group_ids[k]``, reward ``rewards[k]``), whole groups."""
        by_group = group_rewards(group_ids, rewards)
        seen = set(self.groups) & set(by_group)
        if seen:
            raise ValueError(f"groups {sorted(seen)} were added in an earlier round")
        self.groups += list(by_group)
        self.informative |= {g for g, r in by_group.items() if is_informative(r)}
        self.num_rounds += 1

    @property
    def num_informative(self) -> int:
        return len(self.informative)

    @property
    def full(self) -> bool:
        """Whether the informative groups fill the batch."""
        return len(self.informative) >= self.num_groups

    def release(self) -> list[int]:
        """The groups of equal rewards that no later choice can keep (all but the first
        ``multiple``), not released before: drop them now."""
        constant = [g for g in self.groups if g not in self.informative]
        out = [g for g in constant[self.multiple :] if g not in self.released]
        self.released.update(out)
        return out

    def choice(self) -> GroupChoice:
        """The split of every group of every round, as :func:`choose_groups` makes it."""
        choice = choose_by_kind(self.groups, self.informative, self.num_groups, self.multiple)
        assert not self.released & set(choice.kept), "a released group was kept"
        return choice
