"""GRPO: the policy loss a training engine minimises, assembled from ``losses``.

Shape legend: B sequences, T tokens.

loss = agg( keep * w * clippedPG(logp, old, A) + kl_coef * KL(logp || ref) - entropy_coef * H )
with prox = ``prox_logp`` when given, else ``logp.detach()`` (one optimizer step per
batch), rho = pi_prox / mu per token or per sequence (``is_level``), and, by
``clip_against``:
- "proximal" (decoupled PPO): old = prox, w = min(rho, tis_cap); with one step per
  batch the ratio is 1 and only w corrects;
- "behaviour" (coupled PPO): old = ``rollout_logp`` (mu), w = 1: the trust region is
  around the policy that generated the samples.
keep = 1 where is_mask_low <= rho <= is_mask_high (0 bounds: none), else 0. Without
``rollout_logp`` in the batch, w = keep = 1.
See docs/algorithms.md.

Invariant: metrics are normalised by the step totals like the loss, so the engine's
sum over micro-batches is the step mean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import torch

from asyncflow.algorithms.kl import KLEstimator, kl_per_token
from asyncflow.algorithms.loss_configs import AggMode
from asyncflow.algorithms.losses import aggregate, clipped_policy_loss, entropy_bonus
from asyncflow.algorithms.off_policy import (
    ClipAgainst,
    ISLevel,
    is_log_ratio,
    keep_mask,
    mismatch_kl,
    truncated_weights,
)
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
    is_level: ISLevel = "token"
    """The weight and the mask per token, or per sequence (the product of its token
    ratios on each of its tokens)."""
    is_mask_low: float = 0.0
    """Tokens (sequences) whose pi_prox / mu is below this are dropped from the
    policy-gradient term; 0: no lower bound."""
    is_mask_high: float = 0.0
    """... or above this; 0: no upper bound (both 0: no mask)."""
    horizon: int = 0
    """The constant divisor of ``agg = "seq-mean-token-sum-norm"`` (rollout.sampling.max_new_tokens)."""

    @property
    def masking(self) -> bool:
        return self.is_mask_low > 0 or self.is_mask_high > 0

    def ratio_inputs(self, out: ForwardOutput, mb: TokenBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What every policy loss's ratio is taken from: (response mask, pi_prox, old), with
        old = mu (``rollout_logp``) under ``clip_against = "behaviour"``, else pi_prox;
        pi_prox = ``prox_logp`` when given, else logp without gradient."""
        if mb.advantages is None:
            raise ValueError("the policy loss needs batch.advantages (GRPO: grpo_advantages broadcast to tokens)")
        prox_BT = mb.prox_logp if mb.prox_logp is not None else out.logp.detach()
        if self.clip_against != "behaviour":
            return mb.response_mask.float(), prox_BT, prox_BT
        if mb.rollout_logp is None:
            raise ValueError(
                'clip_against = "behaviour" needs batch.rollout_logp (the rollout log-probs); or set clip_against = "proximal"'
            )
        return mb.response_mask.float(), prox_BT, mb.rollout_logp

    def off_policy(
        self,
        pg_BT: torch.Tensor,
        prox_BT: torch.Tensor,
        mb: TokenBatch,
        mask_BT: torch.Tensor,
        ctx: LossContext,
        log_ratio_sink: list[torch.Tensor] | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The policy-gradient term times the off-policy factor (``off_policy_factor``) where
        the batch has the rollout's log-probs, and the mismatch figures; the per-token
        log(pi_prox / mu) goes to ``log_ratio_sink``."""
        if mb.rollout_logp is None:
            return pg_BT, {}
        factor_BT, metrics = off_policy_factor(self, prox_BT, mb.rollout_logp, mask_BT, ctx)
        if log_ratio_sink is not None:
            log_ratio_sink.append((prox_BT - mb.rollout_logp).detach()[mask_BT > 0].float().cpu())
        return pg_BT * factor_BT, metrics

    def regularisers(
        self, out: ForwardOutput, mb: TokenBatch, mask_BT: torch.Tensor, ctx: LossContext, metrics: dict[str, float]
    ) -> torch.Tensor | float:
        """The per-token terms every policy loss adds to its policy-gradient term: the KL
        to the reference (``kl_coef``) and the entropy bonus (``entropy_coef``); 0.0 when
        neither applies; their figures go into ``metrics``."""
        terms_BT: torch.Tensor | float = 0.0
        if self.kl_coef > 0:
            if mb.ref_logp is None:
                raise ValueError("kl_coef > 0 needs batch.ref_logp from a reference actor; or set kl_coef = 0")
            kl_BT = kl_per_token(out.logp, mb.ref_logp, self.kl_estimator)
            terms_BT = terms_BT + self.kl_coef * kl_BT
            metrics["kl"] = float(aggregate(kl_BT.detach(), mask_BT, "token-mean", ctx))
        if out.entropy is not None:
            metrics["entropy"] = float(aggregate(out.entropy.detach(), mask_BT, "token-mean", ctx))
            if self.entropy_coef > 0:
                terms_BT = terms_BT + entropy_bonus(out.entropy, self.entropy_coef)
        return terms_BT


def off_policy_factor(
    cfg: PolicyLossConfig, prox_BT: torch.Tensor, mu_BT: torch.Tensor, mask_BT: torch.Tensor, ctx: LossContext
) -> tuple[torch.Tensor, dict[str, float]]:
    """The per-token factor of the policy-gradient term (truncated weight times keep
    mask, no gradient) and the mismatch figures, as step means."""
    log_r_BT = is_log_ratio(prox_BT, mu_BT, mask_BT, cfg.is_level)
    factor_BT = torch.ones_like(log_r_BT)
    metrics = {"mismatch_kl": float(aggregate(mismatch_kl(prox_BT, mu_BT), mask_BT, "token-mean", ctx))}
    if cfg.clip_against == "proximal" and cfg.tis_cap > 0:
        factor_BT = truncated_weights(log_r_BT, cfg.tis_cap)
        metrics["is_weight"] = float(aggregate(factor_BT, mask_BT, "token-mean", ctx))
        metrics["is_truncated_frac"] = float(aggregate((factor_BT >= cfg.tis_cap).float(), mask_BT, "token-mean", ctx))
    dropped_BT = torch.zeros_like(log_r_BT)
    if cfg.masking:
        keep_BT = keep_mask(log_r_BT, cfg.is_mask_low, cfg.is_mask_high if cfg.is_mask_high > 0 else float("inf"))
        factor_BT, dropped_BT = factor_BT * keep_BT, 1.0 - keep_BT
    metrics["is_masked_frac"] = float(aggregate(dropped_BT, mask_BT, "token-mean", ctx))
    return factor_BT, metrics


Adjust = Callable[
    [ForwardOutput, TokenBatch, torch.Tensor, torch.Tensor, LossContext], tuple[torch.Tensor, torch.Tensor, dict[str, float]]
]
"""``adjust(out, mb, mask_BT, prox_BT, ctx) -> (prox_BT, keep_BT, metrics)``: a loss's own
proximal log-probs and 0/1 factor of its policy-gradient term (``decoupled.py``, ``m2po.py``)."""


def policy_loss_fn(
    cfg: PolicyLossConfig, log_ratio_sink: list[torch.Tensor] | None = None, adjust: Adjust | None = None
) -> LossFn:
    """The ``loss_fn`` for ``TrainEngine.train_step``. The batch needs
    ``advantages`` (and ``rollout_logp``, ``ref_logp`` as the config asks).
    ``log_ratio_sink``: a list that gets, per call, the per-token log(pi_prox / mu)
    of the micro-batch's response tokens (cpu, [N]), for quantiles over the step.
    ``adjust``: replaces pi_prox (and with ``clip_against = "proximal"`` the ratio's
    denominator) and drops tokens from the policy-gradient term."""

    def loss_fn(out: ForwardOutput, mb: TokenBatch, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
        mask_BT, prox_BT, old_BT = cfg.ratio_inputs(out, mb)
        assert mb.advantages is not None  # ratio_inputs refuses a batch without
        metrics: dict[str, float] = {}
        keep_BT: torch.Tensor | None = None
        if adjust is not None:
            prox_BT, keep_BT, metrics = adjust(out, mb, mask_BT, prox_BT, ctx)
            if cfg.clip_against != "behaviour":
                old_BT = prox_BT
        pg_BT, clipped_BT = clipped_policy_loss(out.logp, old_BT, mb.advantages, cfg.clip_low, cfg.clip_high, cfg.dual_clip)
        if keep_BT is not None:
            pg_BT = pg_BT * keep_BT
        pg_BT, off_metrics = cfg.off_policy(pg_BT, prox_BT, mb, mask_BT, ctx, log_ratio_sink)
        metrics.update(off_metrics)
        metrics["pg_loss"] = float(aggregate(pg_BT.detach(), mask_BT, cfg.agg, ctx, cfg.horizon))
        metrics["clip_frac"] = float(aggregate(clipped_BT, mask_BT, "token-mean", ctx))
        loss_BT = pg_BT + cfg.regularisers(out, mb, mask_BT, ctx, metrics)
        return aggregate(loss_BT, mask_BT, cfg.agg, ctx, cfg.horizon), metrics

    return loss_fn


def build_ppo_clip(alg: Any, log_ratio_sink: list[torch.Tensor] | None = None, horizon: int = 0) -> LossFn:
    """The registry's ``ppo_clip`` (``registry.POLICY_LOSSES``): ``policy_loss_fn`` of
    ``ppo_clip_config(alg)``; ``horizon``: rollout.sampling.max_new_tokens (``seq-mean-token-sum-norm``)."""
    return policy_loss_fn(ppo_clip_config(alg, horizon), log_ratio_sink)


def ppo_clip_config(alg: Any, horizon: int = 0) -> PolicyLossConfig:
    """The clip and aggregation of ``alg.loss`` (a ``loss_configs.PPOClipLoss``) and the
    KL, entropy and off-policy terms of ``[algorithm]`` (``alg``). With ``kl_in_reward``
    the KL is in the reward (the estimator's), not in the loss."""
    loss = alg.loss
    return msgspec.structs.replace(
        algorithm_terms(alg),
        clip_low=loss.clip_low,
        clip_high=loss.clip_high,
        dual_clip=loss.dual_clip or None,
        agg=loss.agg,
        horizon=horizon,
    )


def algorithm_terms(alg: Any) -> PolicyLossConfig:
    """What every policy loss reads from ``[algorithm]`` itself, whatever its
    ``[algorithm.loss]``: the KL, entropy and off-policy terms (``off_policy_factor``,
    ``PolicyLossConfig.regularisers``); the clip fields are left at their defaults."""
    return PolicyLossConfig(
        kl_coef=0.0 if alg.kl_in_reward else alg.kl_coef,
        kl_estimator=alg.kl_estimator,
        entropy_coef=alg.entropy_coef,
        tis_cap=alg.is_truncation,
        clip_against=alg.clip_against,
        is_level=alg.is_level,
        is_mask_low=alg.is_mask_low,
        is_mask_high=alg.is_mask_high,
    )
