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
    if num_groups < 1 or multiple < 1:
        raise ValueError(f"num_groups ({num_groups}) and multiple ({multiple}) must be >= 1")
    by_group = group_rewards(group_ids, rewards)
    if len(by_group) < multiple:
        raise ValueError(f"{len(by_group)} groups cannot fill {multiple} trainer ranks with a whole group each")
    informative = [g for g, r in by_group.items() if is_informative(r)]
    constant = [g for g, r in by_group.items() if not is_informative(r)]
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
