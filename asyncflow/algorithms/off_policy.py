"""Off-policy correction between the behaviour policy mu (``rollout_logp``: the
rollout engine that sampled the tokens, possibly versions old) and the proximal
policy pi_prox (the trainer's weights before this update): importance log-ratios
per token or per sequence, truncated weights, IcePop-style masks, and the figures
of the training/inference mismatch. See docs/algorithms.md.

Shape legend: B sequences, T tokens, N response tokens.

Invariants:
- No gradients: inputs are detached first.
- Where pi_prox equals mu every weight is 1, every mask keeps, and mismatch_kl is 0.
- At sequence level every token of a row carries its row's value: the log of the
  product of its token ratios, i.e. the sum of its token log-ratios over the mask.
"""

from __future__ import annotations

from typing import Literal

import torch

from asyncflow.algorithms.kl import kl_per_token
from asyncflow.algorithms.losses import MAX_LOG_RATIO

ISLevel = Literal["token", "sequence"]
ClipAgainst = Literal["proximal", "behaviour"]
"""The PPO ratio's denominator: pi_prox (decoupled PPO, staleness left to the
importance weight) or mu, the behaviour policy (coupled PPO)."""

QUANTILES = {"ratio_p05": 0.05, "ratio_p50": 0.5, "ratio_p95": 0.95}


def is_log_ratio(
    prox_logp_BT: torch.Tensor, rollout_logp_BT: torch.Tensor, mask_BT: torch.Tensor, level: ISLevel = "token"
) -> torch.Tensor:
    """log(pi_prox / mu) of each response token, or (``sequence``) its row's sum over
    the response on every token of the row; 0 off the mask, clamped to
    +-MAX_LOG_RATIO so that exp() stays finite."""
    mask_BT = mask_BT.float()
    log_r_BT = (prox_logp_BT - rollout_logp_BT).detach().float() * mask_BT
    if level == "sequence":
        log_r_BT = log_r_BT.sum(dim=1, keepdim=True) * mask_BT
    elif level != "token":
        raise ValueError(f"unknown importance-sampling level {level!r}; use 'token' or 'sequence'")
    return log_r_BT.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def truncated_weights(log_ratio_BT: torch.Tensor, cap: float) -> torch.Tensor:
    """min(ratio, cap)."""
    return torch.exp(log_ratio_BT).clamp(max=cap)


def keep_mask(log_ratio_BT: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """1.0 where low <= ratio <= high, else 0.0 (the token is dropped)."""
    ratio_BT = torch.exp(log_ratio_BT)
    return ((ratio_BT >= low) & (ratio_BT <= high)).float()


def mismatch_kl(prox_logp_BT: torch.Tensor, rollout_logp_BT: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(mu || pi_prox) from tokens sampled by mu:
    (r - 1) - log r with r = pi_prox / mu; >= 0, unbiased, 0 where they agree."""
    return kl_per_token(rollout_logp_BT.detach(), prox_logp_BT.detach(), "k3")


def ratio_quantiles(log_ratio_N: torch.Tensor) -> dict[str, float]:
    """The 5th, 50th and 95th percentiles of pi_prox / mu over the given tokens
    (nearest rank); {} for no tokens."""
    if log_ratio_N.numel() == 0:
        return {}
    sorted_N = log_ratio_N.detach().float().flatten().sort().values
    last = sorted_N.numel() - 1
    return {name: float(torch.exp(sorted_N[round(q * last)])) for name, q in QUANTILES.items()}
