"""M2PO (Zheng et al. 2025, "Prosperity before Collapse"; AReaL's ``m2_threshold``):
``[algorithm.loss] name = "m2po"``.

Shape legend: B sequences, T tokens, N response tokens of a micro-batch.

A trust region on the second moment of the log-ratio between the behaviour policy and
the proximal one, m_t = (log mu(y_t) - log pi_prox(y_t))^2, instead of on each token's
ratio: the micro-batch's response tokens are sorted by m_t, and the fewest tokens of
largest m_t are dropped from the policy-gradient term for the mean of m over the rest
to be below ``m2_threshold`` (at least one token is kept). Stale tokens are trained on
until the second moment says the batch as a whole has moved too far, so far staler
data stays usable than under a per-token mask. Then ``ppo_clip``'s loss on the kept
tokens (clip, dual clip, ``clip_against``, off-policy weight as ``[algorithm]`` sets).

pi_prox is the batch's ``prox_logp`` (``epochs > 1``) or the current policy without
gradient, as for every loss. Dropped tokens count as 0 in the loss's denominators
(the step's totals), as ``is_mask_*``'s do; AReaL divides by the kept count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from asyncflow.engines.base import ForwardOutput, LossContext, LossFn, TokenBatch


def m2_keep(m2_N: torch.Tensor, threshold: float) -> torch.Tensor:
    """0/1 per token: after dropping the k tokens of largest m2, the mean of the rest is
    below ``threshold``, k the least such (at most N - 1)."""
    n = m2_N.numel()
    if n == 0:
        return torch.ones_like(m2_N)
    sorted_N, order_N = torch.sort(m2_N, descending=True)
    # mean of sorted[k:] for every k
    tail_mean_N = sorted_N.flip(0).cumsum(0).flip(0) / torch.arange(n, 0, -1, dtype=m2_N.dtype, device=m2_N.device)
    below = (tail_mean_N < threshold).nonzero()
    num_dropped = int(below[0]) if len(below) else n - 1
    keep_sorted_N = torch.ones_like(m2_N)
    keep_sorted_N[:num_dropped] = 0.0
    keep_N = torch.empty_like(m2_N)
    keep_N[order_N] = keep_sorted_N
    return keep_N


def m2po_keep_mask(mu_BT: torch.Tensor, prox_BT: torch.Tensor, mask_BT: torch.Tensor, threshold: float) -> torch.Tensor:
    """The 0/1 mask [B, T] of the response tokens M2PO keeps (0 off ``mask_BT``)."""
    on_BT = mask_BT > 0
    keep_BT = torch.zeros_like(mask_BT, dtype=torch.float32)
    m2_N = ((mu_BT.float() - prox_BT.float()) ** 2)[on_BT]
    keep_BT[on_BT] = m2_keep(m2_N, threshold)
    return keep_BT


def build(alg: Any, log_ratio_sink: list[torch.Tensor] | None = None, horizon: int = 0) -> LossFn:
    """The registry's ``m2po``: ``ppo_clip`` on the tokens ``m2po_keep_mask`` keeps."""
    from asyncflow.algorithms.grpo import policy_loss_fn, ppo_clip_config
    from asyncflow.algorithms.losses import aggregate

    threshold = alg.loss.m2_threshold

    def adjust(out: ForwardOutput, mb: TokenBatch, mask_BT: torch.Tensor, prox_BT: torch.Tensor, ctx: LossContext):
        if mb.rollout_logp is None:
            raise ValueError("m2po needs the batch's rollout_logp (the behaviour log-probs)")
        keep_BT = m2po_keep_mask(mb.rollout_logp, prox_BT, mask_BT, threshold)
        return prox_BT, keep_BT, {"m2_masked_frac": float(aggregate(mask_BT - keep_BT, mask_BT, "token-mean", ctx))}

    return policy_loss_fn(ppo_clip_config(alg, horizon), log_ratio_sink, adjust)
