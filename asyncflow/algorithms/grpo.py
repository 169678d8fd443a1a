"""GRPO: the policy loss a training engine minimises, assembled from ``losses``.

Shape legend: B sequences, T tokens.

loss = agg( w * clippedPG(logp, old, A) + kl_coef * KL(logp || ref) - entropy_coef * H )
with prox = ``prox_logp`` when given, else ``logp.detach()`` (one optimizer step per
batch), and, by ``clip_against``:
- "proximal" (decoupled PPO): old = prox, w = min(pi_prox / mu, tis_cap) when the
  batch carries ``rollout_logp`` (1 otherwise); with one step per batch the ratio is
  1 and only w corrects;
- "behaviour" (coupled PPO): old = ``rollout_logp`` (mu), w = 1: the trust region is
  around the policy that generated the samples.
See docs/algorithms.md.

Invariant: metrics are normalised by the step totals like the loss, so the engine's
sum over micro-batches is the step mean.
"""

from __future__ import annotations

import msgspec
import torch

from asyncflow.algorithms.kl import KLEstimator, kl_per_token
from asyncflow.algorithms.losses import AggMode, ClipAgainst, aggregate, clipped_policy_loss, entropy_bonus, truncated_is_weights
from asyncflow.engines.base import ForwardOutput, LossContext, LossFn, TokenBatch


class PolicyLossConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The policy loss of GRPO (and of PPO's actor)."""

    clip_low: float = 0.2
    """Lower PPO clip: ratio >= 1 - clip_low."""
    clip_high: float = 0.2
    """Upper PPO clip: ratio <= 1 + clip_high (DAPO raises it to 0.28)."""
    dual_clip: float | None = None
    """Dual-clip bound c > 1 for negative advantages; None disables it."""
    kl_coef: float = 0.0
    """Weight of the KL-to-reference loss term; 0 disables it (needs ref_logp)."""
    kl_estimator: KLEstimator = "k3"
    """k1, k2 or k3 (see asyncflow.algorithms.kl)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    agg: AggMode = "token-mean"
    """How per-token losses reduce: token-mean, seq-mean-token-mean, seq-mean-token-sum."""
    tis_cap: float = 2.0
    """Cap of the truncated importance weight pi_prox / mu for stale samples; 0
    disables the correction. Unused with clip_against = "behaviour"."""
    clip_against: ClipAgainst = "proximal"
    """The ratio's denominator: "proximal" (pi_prox, times the weight above) or
    "behaviour" (mu = rollout_logp, no separate weight)."""


def policy_loss_fn(cfg: PolicyLossConfig) -> LossFn:
    """The ``loss_fn`` for ``TrainEngine.train_step``. The batch needs
    ``advantages`` (and ``rollout_logp``, ``ref_logp`` as the config asks)."""

    def loss_fn(out: ForwardOutput, mb: TokenBatch, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
        if mb.advantages is None:
            raise ValueError("the policy loss needs batch.advantages (GRPO: grpo_advantages broadcast to tokens)")
        mask_BT = mb.response_mask.float()
        logp_BT = out.logp
        prox_BT = mb.prox_logp if mb.prox_logp is not None else logp_BT.detach()
        behaviour = cfg.clip_against == "behaviour"
        if behaviour and mb.rollout_logp is None:
            raise ValueError('clip_against = "behaviour" needs batch.rollout_logp (the rollout log-probs); '
                             'or set clip_against = "proximal"')
        old_BT = mb.rollout_logp if behaviour else prox_BT
        pg_BT, clipped_BT = clipped_policy_loss(logp_BT, old_BT, mb.advantages, cfg.clip_low, cfg.clip_high, cfg.dual_clip)
        metrics: dict[str, float] = {}
        if not behaviour and cfg.tis_cap > 0 and mb.rollout_logp is not None:
            w_BT = truncated_is_weights(prox_BT, mb.rollout_logp, cfg.tis_cap)
            pg_BT = pg_BT * w_BT
            metrics["is_weight"] = float(aggregate(w_BT, mask_BT, "token-mean", ctx))
            metrics["is_truncated_frac"] = float(aggregate((w_BT >= cfg.tis_cap).float(), mask_BT, "token-mean", ctx))
        loss_BT = pg_BT
        metrics["pg_loss"] = float(aggregate(pg_BT.detach(), mask_BT, cfg.agg, ctx))
        metrics["clip_frac"] = float(aggregate(clipped_BT, mask_BT, "token-mean", ctx))
        if cfg.kl_coef > 0:
            if mb.ref_logp is None:
                raise ValueError("kl_coef > 0 needs batch.ref_logp from a reference actor; or set kl_coef = 0")
            kl_BT = kl_per_token(logp_BT, mb.ref_logp, cfg.kl_estimator)
            loss_BT = loss_BT + cfg.kl_coef * kl_BT
            metrics["kl"] = float(aggregate(kl_BT.detach(), mask_BT, "token-mean", ctx))
        if out.entropy is not None:
            metrics["entropy"] = float(aggregate(out.entropy.detach(), mask_BT, "token-mean", ctx))
            if cfg.entropy_coef > 0:
                loss_BT = loss_BT + entropy_bonus(out.entropy, cfg.entropy_coef)
        return aggregate(loss_BT, mask_BT, cfg.agg, ctx), metrics

    return loss_fn
