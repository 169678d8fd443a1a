"""PPO: the critic's loss and the advantage pipeline (KL in the reward, GAE, whitening).
The actor's loss is ``asyncflow.algorithms.grpo.policy_loss_fn`` fed GAE advantages.

Shape legend: B sequences, T tokens.

Invariant: token rewards, values and advantages are zero off the response mask;
the scalar reward sits on the last response token, the KL penalty (if any) on every
response token.
"""

from __future__ import annotations

import msgspec
import torch

from asyncflow.algorithms.advantages import gae, last_token_rewards, masked_whiten
from asyncflow.algorithms.kl import KLEstimator, kl_per_token
from asyncflow.algorithms.losses import AggMode, aggregate, clipped_value_loss
from asyncflow.engines.base import ForwardOutput, LossContext, LossFn, TokenBatch


class PPOConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Advantage estimation and critic loss of PPO."""

    gamma: float = 1.0
    """Discount per token."""
    lam: float = 0.95
    """GAE lambda."""
    kl_in_reward_coef: float = 0.0
    """Per-token KL penalty subtracted from the reward (needs ref_logp); 0 disables it."""
    kl_estimator: KLEstimator = "k1"
    """Estimator of the in-reward KL."""
    whiten_advantages: bool = True
    """Normalise advantages over the batch's response tokens."""
    value_clip: float | None = 0.2
    """Value clipping around the rollout-time values; None disables it."""
    agg: AggMode = "token-mean"
    """Aggregation of the value loss."""


def ppo_advantages(
    cfg: PPOConfig,
    rewards_B: torch.Tensor,
    values_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    logp_BT: torch.Tensor | None = None,
    ref_logp_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages_BT, returns_BT) for a batch: sparse reward on the last token, minus
    the per-token KL to the reference when configured, then GAE."""
    token_rewards_BT = last_token_rewards(rewards_B, mask_BT)
    if cfg.kl_in_reward_coef > 0:
        if logp_BT is None or ref_logp_BT is None:
            raise ValueError("kl_in_reward_coef > 0 needs the rollout log-probs and the reference log-probs")
        token_rewards_BT = (
            token_rewards_BT - cfg.kl_in_reward_coef * kl_per_token(logp_BT, ref_logp_BT, cfg.kl_estimator) * mask_BT
        )
    adv_BT, returns_BT = gae(token_rewards_BT, values_BT, mask_BT, cfg.gamma, cfg.lam)
    if cfg.whiten_advantages:
        adv_BT = masked_whiten(adv_BT, mask_BT)
    return adv_BT, returns_BT


def critic_loss_fn(cfg: PPOConfig) -> LossFn:
    """The ``loss_fn`` for a critic ``TrainEngine`` (``critic=true``); the batch needs
    ``returns`` and, with value clipping, ``old_values``."""

    def loss_fn(out: ForwardOutput, mb: TokenBatch, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
        if out.values is None:
            raise ValueError("the critic loss needs values: build the train engine with critic = true")
        if mb.returns is None:
            raise ValueError("the critic loss needs batch.returns (from ppo_advantages)")
        clip = cfg.value_clip if mb.old_values is not None else None
        old_BT = mb.old_values if mb.old_values is not None else out.values.detach()
        loss_BT, clipped_BT = clipped_value_loss(out.values, old_BT, mb.returns, clip)
        mask_BT = mb.response_mask.float()
        loss = aggregate(loss_BT, mask_BT, cfg.agg, ctx)
        return loss, {
            "value_loss": float(loss.detach()),
            "value_clip_frac": float(aggregate(clipped_BT, mask_BT, "token-mean", ctx)),
        }

    return loss_fn
