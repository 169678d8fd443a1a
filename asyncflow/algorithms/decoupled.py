"""Decoupled PPO with the log-linear proximal approximation (AReaL's
``prox_logp_method = "loglinear"``): ``[algorithm.loss] name = "decoupled_ppo"``.

Shape legend: B sequences, T tokens.

Decoupled PPO (Fu et al. 2025, AReaL) clips pi / pi_prox and weights by pi_prox / mu.
Recomputing pi_prox costs a forward pass over the batch; the approximation instead
places the proximal policy on the line, in log space, between the behaviour policy
and the current one, by policy version. With v_theta the trainer's version, v_prox =
v_theta - 1 and v_mu the version that sampled the token (staleness d = v_theta - v_mu):

    alpha_t         = clamp((v_prox - v_mu) / (v_theta - v_mu), 0, 1) = clamp((d - 1) / d, 0, 1)   (0 where d <= 0)
    log pi_prox(y_t) = log mu(y_t) + alpha_t (sg(log pi(y_t)) - log mu(y_t))

then the loss is ``ppo_clip``'s with that pi_prox: old = pi_prox (``clip_against =
"proximal"``, required) and w = min(pi_prox / mu, ``is_truncation``). A token one version
old (d = 1) gets pi_prox = mu, one of d versions gets (d - 1) / d of the way to pi. The
batch carries each token's staleness d as ``extra["staleness"]`` (the trainer fills it
from the rows' versions, or per token with partial rollout); a batch without it is
refused. With ``epochs > 1`` no forward pass runs for pi_prox (the registry's
``computes_prox``), and each epoch interpolates towards its own current policy, as
AReaL does over its mini-batches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from asyncflow.engines.base import ForwardOutput, LossContext, LossFn, TokenBatch

STALENESS = "staleness"
"""The ``TokenBatch.extra`` key of each token's staleness d = v_theta - v_mu (float [B, T])."""


def loglinear_alpha(staleness_BT: torch.Tensor) -> torch.Tensor:
    """clamp((d - 1) / d, 0, 1), 0 where d <= 0."""
    d_BT = staleness_BT.float()
    return torch.where(d_BT > 0, (d_BT - 1) / d_BT.clamp(min=1.0), torch.zeros_like(d_BT)).clamp(0.0, 1.0)


def loglinear_prox(mu_BT: torch.Tensor, logp_BT: torch.Tensor, staleness_BT: torch.Tensor) -> torch.Tensor:
    """log pi_prox = log mu + alpha (log pi - log mu), without gradient."""
    return mu_BT + loglinear_alpha(staleness_BT) * (logp_BT.detach() - mu_BT)


def adjust(out: ForwardOutput, mb: TokenBatch, mask_BT: torch.Tensor, prox_BT: torch.Tensor, ctx: LossContext):
    """``grpo.Adjust``: pi_prox by the approximation; no token dropped."""
    if mb.rollout_logp is None or STALENESS not in mb.extra:
        raise ValueError("decoupled_ppo needs the batch's rollout_logp and extra['staleness'] (the trainer fills both)")
    prox_BT = loglinear_prox(mb.rollout_logp, out.logp, mb.extra[STALENESS]) * mask_BT
    return prox_BT, None, {}


def build(alg: Any, log_ratio_sink: list[torch.Tensor] | None = None, horizon: int = 0) -> LossFn:
    """The registry's ``decoupled_ppo``: ``ppo_clip`` with the approximated pi_prox."""
    from asyncflow.algorithms.grpo import policy_loss_fn, ppo_clip_config

    return policy_loss_fn(ppo_clip_config(alg, horizon), log_ratio_sink, adjust)
