"""Policy and value losses, entropy bonus, loss aggregation.

Shape legend: B sequences, T tokens.

Three log-probs of the same sampled tokens meet here:
- ``rollout_logp`` (behaviour mu): from the rollout engine, possibly k versions old;
- ``prox_logp`` (proximal): the trainer's policy before this update; when one batch
  feeds one optimizer step it equals ``logp.detach()`` and need not be computed;
- ``logp``: the trainer's current log-probs, with gradient.
The PPO ratio pi/pi_prox is clipped (trust region); the staleness pi_prox/mu is
corrected by a truncated importance weight min(pi_prox/mu, cap), without gradient
(decoupled PPO with truncated IS; ``off_policy``). A sample generated k versions ago
therefore contributes at most ``cap`` times its on-policy weight, which keeps k > 0
stable. Coupled PPO instead clips pi/mu directly: a trust region around the policy
that generated the samples.

Invariants:
- Per-token losses are 0 off ``mask_BT``.
- ``aggregate`` divided by the step totals of a ``LossContext`` makes the sum over
  micro-batches (and ranks, after FSDP's gradient averaging) equal the step mean.
"""

from __future__ import annotations

import torch

from asyncflow.algorithms.loss_configs import AggMode
from asyncflow.engines.base import LossContext

MAX_LOG_RATIO = 20.0
"""Log-ratios are clamped to +-20 before exp: no inf, and a weight of e^20 is
clipped or truncated anyway."""


def aggregate(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: AggMode = "token-mean",
    ctx: LossContext | None = None,
    horizon: int = 0,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    token-mean: sum over all masked tokens / number of masked tokens.
    seq-mean-token-mean: mean over sequences of each sequence's token mean.
    seq-mean-token-sum: mean over sequences of each sequence's token sum.
    seq-mean-token-sum-norm: seq-mean-token-sum / ``horizon`` (Dr. GRPO: a constant,
    the generation budget, so a response's length does not scale its tokens' weight).
    token-sum: sum over all masked tokens.
    With ``ctx`` the denominators are the step totals times ``1 / dp_size`` (token-sum:
    the sum times ``dp_size``, so the gradient average over ranks is the step's sum);
    without, this batch's own totals."""
    mask_BT = mask_BT.float()
    if mode in ("token-mean", "token-sum"):
        total = (loss_BT * mask_BT).sum()
        if mode == "token-sum":
            return total * (ctx.dp_size if ctx else 1)
        denom = ctx.num_tokens / ctx.dp_size if ctx else mask_BT.sum().clamp(min=1.0)
        return total / denom
    per_seq_B = (loss_BT * mask_BT).sum(dim=1)
    if mode == "seq-mean-token-mean":
        per_seq_B = per_seq_B / mask_BT.sum(dim=1).clamp(min=1.0)
    elif mode == "seq-mean-token-sum-norm":
        if horizon < 1:
            raise ValueError("seq-mean-token-sum-norm divides by a constant horizon: pass rollout.sampling.max_new_tokens")
        per_seq_B = per_seq_B / horizon
    elif mode != "seq-mean-token-sum":
        raise ValueError(
            f"unknown aggregation {mode!r}; use token-mean, seq-mean-token-mean, seq-mean-token-sum, "
            "seq-mean-token-sum-norm or token-sum"
        )
    has_tokens_B = (mask_BT.sum(dim=1) > 0).float()
    denom = ctx.num_seqs / ctx.dp_size if ctx else has_tokens_B.sum().clamp(min=1.0)
    return (per_seq_B * has_tokens_B).sum() / denom


def renormalise(mode: AggMode, provisional: LossContext, real: LossContext) -> float:
    """The factor that turns ``aggregate(..., mode, provisional)`` into ``aggregate(...,
    mode, real)``: the loss (and its gradient) of a step trained in parts before its
    totals were known (``workflow.stream_step``). ``token-mean`` divides by tokens, the
    ``seq-mean-*`` modes by sequences, ``token-sum`` by nothing."""
    if mode == "token-sum":
        return 1.0
    if mode == "token-mean":
        return provisional.num_tokens / real.num_tokens
    return provisional.num_seqs / real.num_seqs


def clipped_policy_loss(
    logp_BT: torch.Tensor,
    prox_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate per token: max(-A r, -A clip(r, 1-low, 1+high)),
    r = exp(logp - prox_logp). ``dual_clip`` c > 1 also bounds the loss of negative
    advantages by -A c. Returns (loss_BT, clipped_BT as float 0/1)."""
    ratio_BT = torch.exp((logp_BT - prox_logp_BT).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    unclipped_BT = -adv_BT * ratio_BT
    clipped_BT = -adv_BT * ratio_BT.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_BT = torch.maximum(unclipped_BT, clipped_BT)
    was_clipped_BT = (clipped_BT > unclipped_BT).float()
    if dual_clip is not None:
        bound_BT = -adv_BT * dual_clip
        loss_BT = torch.where(adv_BT < 0, torch.minimum(loss_BT, bound_BT), loss_BT)
    return loss_BT, was_clipped_BT


def clipped_value_loss(
    values_BT: torch.Tensor, old_values_BT: torch.Tensor, returns_BT: torch.Tensor, clip: float | None = 0.2
) -> tuple[torch.Tensor, torch.Tensor]:
    """0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, -c, c);
    ``clip`` None: plain 0.5 (V - R)^2. Returns (loss_BT, clipped_BT as float 0/1)."""
    unclipped_BT = (values_BT - returns_BT) ** 2
    if clip is None:
        return 0.5 * unclipped_BT, torch.zeros_like(unclipped_BT)
    v_clipped_BT = old_values_BT + (values_BT - old_values_BT).clamp(-clip, clip)
    clipped_BT = (v_clipped_BT - returns_BT) ** 2
    return 0.5 * torch.maximum(unclipped_BT, clipped_BT), (clipped_BT > unclipped_BT).float()


def entropy_bonus(entropy_BT: torch.Tensor, coef: float) -> torch.Tensor:
    """Per-token loss term that rewards entropy: -coef * H."""
    return -coef * entropy_BT
