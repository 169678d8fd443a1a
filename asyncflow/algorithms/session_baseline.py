"""Advantages of gateway sessions (``[rollout.gateway] train``), where a batch mixes
GRPO groups (sessions sharing a group key, ``algorithm.group_size`` of them) with lone
sessions (no key: a group of one, which GRPO would give advantage 0).

- A group's rows: GRPO's, ``(r - mean) / (std + eps)`` within the group (or ``r - mean``
  without ``std_normalize``).
- A lone row b: RLOO's leave-one-out baseline over the batch's other lone rows,
  ``A_b = r_b - mean_{j != b} r_j`` (0 when it is the batch's only lone row).

Why RLOO and not REINFORCE++: a baseline that leaves the row's own reward out is
independent of it, so the estimate stays unbiased with the few lone sessions a step may
hold (REINFORCE++ whitens by the batch mean and std, which include the row itself and
the grouped rows, and with 2 or 3 lone sessions the std is noise). No std division, as
RLOO's.

Why a module of its own: the registry's estimators (``estimators.py``, ``registry.py``)
assume every group has ``group_size`` rows; the RLOO estimator being added on branch
``losses`` is over prompt groups, not over the batch's lone rows. When that lands this
can become one more registry entry.

Shape legend: B rows, T tokens.
"""

from __future__ import annotations

import torch

from asyncflow.algorithms.advantages import broadcast_to_tokens, grpo_advantages
from asyncflow.algorithms.estimators import AdvantageInputs, Advantages
from asyncflow.algorithms.kl import kl_penalized_rewards


def lone_rloo(rewards_L: torch.Tensor) -> torch.Tensor:
    """Each of L lone rows' reward minus the mean of the other L - 1 (0 when L is 1)."""
    n = rewards_L.numel()
    if n < 2:
        return torch.zeros_like(rewards_L, dtype=torch.float32)
    rewards_L = rewards_L.float()
    return rewards_L - (rewards_L.sum() - rewards_L) / (n - 1)


def session_advantages(inputs: AdvantageInputs) -> Advantages:
    alg, tb, rewards_B = inputs.alg, inputs.batch, inputs.rewards_B
    if alg.kl_in_reward and alg.kl_coef > 0:
        if tb.rollout_logp is None or tb.ref_logp is None:
            raise ValueError("kl_in_reward needs the rows' rollout_logp and ref_logp (kl_coef > 0 runs the reference)")
        rewards_B = kl_penalized_rewards(rewards_B, tb.rollout_logp, tb.ref_logp, tb.response_mask, alg.kl_coef, alg.kl_estimator)
    groups: dict[int, list[int]] = {}
    for pos, group in enumerate(inputs.group_ids):
        groups.setdefault(group, []).append(pos)
    adv_B = torch.zeros(len(inputs.group_ids), dtype=torch.float32)
    lone = [positions[0] for positions in groups.values() if len(positions) == 1]
    for positions in groups.values():
        if len(positions) > 1:
            adv_B[positions] = grpo_advantages(rewards_B[positions].view(1, -1), divide_by_std=alg.std_normalize).view(-1)
    if lone:
        adv_B[lone] = lone_rloo(rewards_B[lone])
    return Advantages(broadcast_to_tokens(adv_B, tb.response_mask))
