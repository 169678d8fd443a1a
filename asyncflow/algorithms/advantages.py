"""Advantage estimators: GRPO group normalisation and GAE (PPO).

Shape legend: G prompt groups, N samples per group, B sequences (= G * N when
grouped), T tokens.

Invariants:
- Pure functions on tensors, no gradients (inputs are data, not graph nodes).
- Token tensors are zero wherever ``mask_BT`` is 0.
- GAE treats the masked span of each row as one episode: the value after its last
  token is 0 (the response ended), and nothing leaks in from padding.
"""

from __future__ import annotations

import torch


def grpo_advantages(rewards_GN: torch.Tensor, divide_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean_group) / (std_group + eps), or r - mean_group without the std
    division (Dr. GRPO). std is the unbiased sample std; a group of one sample, or
    of equal rewards, gets advantage 0."""
    rewards_GN = rewards_GN.float()
    # Groups of equal rewards carry no signal: exactly 0, not rounding noise / eps.
    varied_G1 = (rewards_GN.amax(dim=1, keepdim=True) > rewards_GN.amin(dim=1, keepdim=True)).float()
    centred_GN = (rewards_GN - rewards_GN.mean(dim=1, keepdim=True)) * varied_G1
    if not divide_by_std:
        return centred_GN
    if rewards_GN.shape[1] < 2:
        return centred_GN  # all zeros: a single sample has no group to compare with
    std_G1 = rewards_GN.std(dim=1, keepdim=True)
    return centred_GN / (std_G1 + eps)


def broadcast_to_tokens(values_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """A per-sequence value on every masked token: [B] -> [B, T]."""
    return values_B.float().unsqueeze(1) * mask_BT.float()


def last_token_rewards(rewards_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Sparse token rewards: each sequence's reward on its last masked token."""
    mask_BT = mask_BT.float()
    positions_BT = torch.arange(mask_BT.shape[1], device=mask_BT.device).expand_as(mask_BT)
    last_B = torch.where(mask_BT > 0, positions_BT, torch.full_like(positions_BT, -1)).max(dim=1).values
    out_BT = torch.zeros_like(mask_BT)
    rows = (last_B >= 0).nonzero().squeeze(1)
    out_BT[rows, last_B[rows]] = rewards_B.float()[rows]
    return out_BT


def rloo_advantages(rewards_GN: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: r_i - mean_{j != i} r_j = (r_i - mean) N / (N - 1) within
    each group (a group of one: 0)."""
    rewards_GN = rewards_GN.float()
    n = rewards_GN.shape[1]
    if n < 2:
        return torch.zeros_like(rewards_GN)
    return (rewards_GN - rewards_GN.mean(dim=1, keepdim=True)) * (n / (n - 1))


def discounted_returns(rewards_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """G_t = r_t + gamma G_{t+1} over each row's masked tokens; a masked-out token
    (an observation inside a multi-turn response) passes G through unchanged."""
    mask_BT = mask_BT.float()
    returns_BT = torch.zeros_like(mask_BT)
    running_B = torch.zeros_like(mask_BT[:, 0])
    for t in reversed(range(mask_BT.shape[1])):
        new_B = rewards_BT[:, t].float() + gamma * running_B
        returns_BT[:, t] = new_B * mask_BT[:, t]
        running_B = new_B * mask_BT[:, t] + running_B * (1 - mask_BT[:, t])
    return returns_BT


def gae(
    rewards_BT: torch.Tensor, values_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation. Returns (advantages_BT, returns_BT) with
    returns = advantages + values on masked tokens.

    delta_t = r_t + gamma * V_{t+1} - V_t (V_{t+1} = 0 after the last token)
    A_t = delta_t + gamma * lam * A_{t+1}"""
    mask_BT = mask_BT.float()
    rewards_BT = rewards_BT.float() * mask_BT
    values_BT = values_BT.float() * mask_BT
    T = mask_BT.shape[1]
    adv_BT = torch.zeros_like(rewards_BT)
    next_value_B = torch.zeros_like(rewards_BT[:, 0])
    next_adv_B = torch.zeros_like(rewards_BT[:, 0])
    for t in reversed(range(T)):
        delta_B = rewards_BT[:, t] + gamma * next_value_B - values_BT[:, t]
        adv_B = (delta_B + gamma * lam * next_adv_B) * mask_BT[:, t]
        adv_BT[:, t] = adv_B
        # Outside the mask, carry nothing backwards into the previous token.
        next_value_B = values_BT[:, t] * mask_BT[:, t]
        next_adv_B = adv_B
    return adv_BT, (adv_BT + values_BT) * mask_BT


def masked_whiten(x_BT: torch.Tensor, mask_BT: torch.Tensor, eps: float = 1e-8, unbiased: bool = False) -> torch.Tensor:
    """(x - mean) / std over masked entries (population std; ``unbiased``: the sample
    std, as verl's REINFORCE++ whitens); zero off the mask."""
    mask_BT = mask_BT.float()
    n = mask_BT.sum().clamp(min=1.0)
    mean = (x_BT * mask_BT).sum() / n
    var = (((x_BT - mean) * mask_BT) ** 2).sum() / ((n - 1).clamp(min=1.0) if unbiased else n)
    return (x_BT - mean) * torch.rsqrt(var + eps) * mask_BT
