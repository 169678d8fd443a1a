"""The advantage estimators of the registry (``registry.ESTIMATORS``): one function
each, ``f(AdvantageInputs) -> Advantages``, reading its own knobs from ``[algorithm]``.

Shape legend: B sequences, T tokens, G prompt groups, N responses per group.

Invariants:
- ``rewards_B`` are the rows' rewards as shaped before any estimator (custom roles'
  scores, the overlong penalty); an estimator adds what is its own (the KL penalty
  with ``kl_in_reward``).
- Advantages (and returns) are zero off ``batch.response_mask``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from asyncflow.algorithms.advantages import broadcast_to_tokens, grpo_advantages
from asyncflow.algorithms.kl import kl_penalized_rewards
from asyncflow.algorithms.ppo import PPOConfig, ppo_advantages
from asyncflow.engines.base import TokenBatch


@dataclass
class AdvantageInputs:
    batch: TokenBatch
    """The rows (``rollout_logp``, ``ref_logp`` as the run has them)."""
    rewards_B: torch.Tensor
    group_ids: list[int]
    """Each row's prompt group; a group's rows are ``alg.group_size`` of them."""
    alg: Any
    """The run's ``[algorithm]``."""
    values_BT: torch.Tensor | None = None
    """The critic's values, for an estimator that ``needs_critic``."""


@dataclass
class Advantages:
    advantages_BT: torch.Tensor
    returns_BT: torch.Tensor | None = None
    """The critic's regression targets (estimators with a critic)."""


def grpo(inputs: AdvantageInputs) -> Advantages:
    """Each row's reward (minus kl_coef times its sequence KL to the reference with
    ``kl_in_reward``) normalised within its prompt group, on every response token."""
    alg, tb, rewards_B = inputs.alg, inputs.batch, inputs.rewards_B
    if alg.kl_in_reward and alg.kl_coef > 0:
        if tb.rollout_logp is None or tb.ref_logp is None:
            raise ValueError("kl_in_reward needs the rows' rollout_logp and ref_logp (kl_coef > 0 runs the reference)")
        rewards_B = kl_penalized_rewards(rewards_B, tb.rollout_logp, tb.ref_logp, tb.response_mask, alg.kl_coef, alg.kl_estimator)
    groups: dict[int, list[int]] = {}
    for pos, group in enumerate(inputs.group_ids):
        groups.setdefault(group, []).append(pos)
    order = [pos for positions in groups.values() for pos in positions]
    adv_GN = grpo_advantages(rewards_B[order].view(-1, alg.group_size), divide_by_std=alg.std_normalize)
    adv_B = torch.empty_like(rewards_B)
    adv_B[order] = adv_GN.reshape(-1)
    return Advantages(broadcast_to_tokens(adv_B, tb.response_mask))


def ppo_config(alg: Any) -> PPOConfig:
    """GAE's and the critic loss's knobs from ``[algorithm]``."""
    return PPOConfig(
        gamma=alg.gamma,
        lam=alg.lam,
        value_clip=alg.value_clip,
        kl_estimator=alg.kl_estimator,
        kl_in_reward_coef=alg.kl_coef if alg.kl_in_reward else 0.0,
    )


def gae(inputs: AdvantageInputs) -> Advantages:
    """GAE over the critic's values: the reward on each row's last token (minus the
    per-token KL with ``kl_in_reward``), whitened over the batch's response tokens."""
    if inputs.values_BT is None:
        raise ValueError("GAE needs the critic's values (the estimator declares needs_critic)")
    tb = inputs.batch
    adv_BT, returns_BT = ppo_advantages(
        ppo_config(inputs.alg), inputs.rewards_B, inputs.values_BT, tb.response_mask, tb.rollout_logp, tb.ref_logp
    )
    return Advantages(adv_BT, returns_BT)
