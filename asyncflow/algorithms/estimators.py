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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from asyncflow.algorithms.advantages import (
    broadcast_to_tokens,
    discounted_returns,
    grpo_advantages,
    last_token_rewards,
    masked_whiten,
    rloo_advantages,
)
from asyncflow.algorithms.kl import kl_penalized_rewards, kl_per_token
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


def sequence_rewards(inputs: AdvantageInputs) -> torch.Tensor:
    """Each row's reward, minus kl_coef times its sequence KL to the reference (summed
    over its response tokens) with ``kl_in_reward``."""
    alg, tb, rewards_B = inputs.alg, inputs.batch, inputs.rewards_B
    if alg.kl_in_reward and alg.kl_coef > 0:
        if tb.rollout_logp is None or tb.ref_logp is None:
            raise ValueError("kl_in_reward needs the rows' rollout_logp and ref_logp (kl_coef > 0 runs the reference)")
        rewards_B = kl_penalized_rewards(rewards_B, tb.rollout_logp, tb.ref_logp, tb.response_mask, alg.kl_coef, alg.kl_estimator)
    return rewards_B


def per_group(inputs: AdvantageInputs, rewards_B: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``fn`` of the rewards as [G, N] (each prompt group a row), back in the rows' order, [B]."""
    groups: dict[int, list[int]] = {}
    for pos, group in enumerate(inputs.group_ids):
        groups.setdefault(group, []).append(pos)
    order = [pos for positions in groups.values() for pos in positions]
    adv_GN = fn(rewards_B[order].view(-1, inputs.alg.group_size))
    adv_B = torch.empty_like(rewards_B, dtype=torch.float32)
    adv_B[order] = adv_GN.reshape(-1)
    return adv_B


def grpo(inputs: AdvantageInputs) -> Advantages:
    """Each row's reward (minus kl_coef times its sequence KL to the reference with
    ``kl_in_reward``) normalised within its prompt group, on every response token."""
    std = inputs.alg.std_normalize
    adv_B = per_group(inputs, sequence_rewards(inputs), lambda r_GN: grpo_advantages(r_GN, divide_by_std=std))
    return Advantages(broadcast_to_tokens(adv_B, inputs.batch.response_mask))


def rloo(inputs: AdvantageInputs) -> Advantages:
    """RLOO (Ahmadian et al. 2024): each row's reward (KL-penalised as GRPO's) minus the
    mean of the other rows of its prompt group, on every response token."""
    adv_B = per_group(inputs, sequence_rewards(inputs), rloo_advantages)
    return Advantages(broadcast_to_tokens(adv_B, inputs.batch.response_mask))


def reinforce_plus_plus(inputs: AdvantageInputs) -> Advantages:
    """REINFORCE++ (Hu 2025): the reward on each row's last token, minus kl_coef times
    each token's KL with ``kl_in_reward``, discounted returns (``gamma``), whitened over
    the batch's response tokens (sample std). No critic, no groups."""
    alg, tb = inputs.alg, inputs.batch
    mask_BT = tb.response_mask
    rewards_BT = last_token_rewards(inputs.rewards_B, mask_BT)
    if alg.kl_in_reward and alg.kl_coef > 0:
        if tb.rollout_logp is None or tb.ref_logp is None:
            raise ValueError("kl_in_reward needs the rows' rollout_logp and ref_logp (kl_coef > 0 runs the reference)")
        rewards_BT = rewards_BT - alg.kl_coef * kl_per_token(tb.rollout_logp, tb.ref_logp, alg.kl_estimator) * mask_BT
    returns_BT = discounted_returns(rewards_BT, mask_BT, alg.gamma)
    return Advantages(masked_whiten(returns_BT, mask_BT, unbiased=True))


def reinforce_plus_plus_baseline(inputs: AdvantageInputs) -> Advantages:
    """REINFORCE++ with a baseline: each row's reward (KL-penalised as GRPO's) minus its
    prompt group's mean, on every response token, whitened over the batch's response
    tokens (sample std)."""
    centred_B = per_group(inputs, sequence_rewards(inputs), lambda r_GN: r_GN.float() - r_GN.float().mean(dim=1, keepdim=True))
    mask_BT = inputs.batch.response_mask
    return Advantages(masked_whiten(broadcast_to_tokens(centred_B, mask_BT), mask_BT, unbiased=True))


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
