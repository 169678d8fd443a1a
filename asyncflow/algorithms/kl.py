"""KL estimators between the current policy and a reference policy, per token
(Schulman's k1, k2, k3; http://joschu.net/blog/kl-approx.html).

Shape legend: B sequences, T tokens.

With samples x ~ pi and log r = log ref(x) - log pi(x):
- k1 = -log r                   unbiased, high variance, can be negative
- k2 = (log r)^2 / 2            biased, low variance, >= 0
- k3 = (r - 1) - log r          unbiased, low variance, >= 0
Invariant: every estimator is 0 where the two log-probs are equal.
"""

from __future__ import annotations

from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3"]

K3_LOG_R_BOUND = 20.0
"""k3's log r is bounded to this before the exponential (verl's bound); the estimate to ``clamp``."""


def kl_per_token(
    logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, estimator: KLEstimator = "k3", clamp: float | None = 10.0
) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate; ``clamp`` None: unbounded. k1 and k2: log r is
    bounded to +-``clamp``. k3 as verl's ``low_var_kl``: log r within +-``K3_LOG_R_BOUND``
    (no overflow of the exponential), then the estimate itself within +-``clamp``, so
    one token whose probabilities disagree wildly adds at most ``clamp`` (bounding only
    log r at 10 let it add e^10 - 11 = 22,015, enough to rank a right answer's row below
    a wrong one's with the KL in the reward)."""
    log_r_BT = ref_logp_BT - logp_BT
    if estimator == "k3":
        if clamp is not None:
            log_r_BT = log_r_BT.clamp(-K3_LOG_R_BOUND, K3_LOG_R_BOUND)
        k3_BT = torch.expm1(log_r_BT) - log_r_BT
        return k3_BT.clamp(-clamp, clamp) if clamp is not None else k3_BT
    if clamp is not None:
        log_r_BT = log_r_BT.clamp(-clamp, clamp)
    if estimator == "k1":
        return -log_r_BT
    if estimator == "k2":
        return 0.5 * log_r_BT**2
    raise ValueError(f"unknown KL estimator {estimator!r}; use 'k1', 'k2' or 'k3'")


def kl_penalized_rewards(
    rewards_B: torch.Tensor,
    logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    coef: float,
    estimator: KLEstimator = "k1",
) -> torch.Tensor:
    """KL in the reward for sequence-level algorithms (GRPO):
    r_b - coef * sum_t KL_t over the response tokens of b, before group normalisation."""
    kl_BT = kl_per_token(logp_BT, ref_logp_BT, estimator) * mask_BT.float()
    return rewards_B.float() - coef * kl_BT.sum(dim=1)
