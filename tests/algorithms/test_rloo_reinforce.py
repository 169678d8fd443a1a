"""RLOO, REINFORCE++ and REINFORCE++ with a baseline (algorithms/estimators.py), checked
against their formulas computed here (Ahmadian et al. 2024; Hu 2025); reachable from
``[algorithm] name`` through the registry alone."""

from __future__ import annotations

import pytest
import torch

from asyncflow.algorithms import registry
from asyncflow.algorithms.estimators import AdvantageInputs
from asyncflow.config.load import load_config_text
from asyncflow.engines.base import TokenBatch

pytestmark = pytest.mark.timeout(30)

B, T, N = 8, 7, 4


def _rows(seed=0, ref=False):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None, :] < torch.tensor([7, 3, 5, 1, 6, 7, 2, 4])[:, None]).float()
    tb = TokenBatch(
        input_ids=torch.zeros(B, T, dtype=torch.long),
        attention_mask=torch.ones(B, T),
        response_mask=mask,
        rollout_logp=-torch.rand(B, T, generator=g) * mask,
        ref_logp=(-torch.rand(B, T, generator=g) * mask) if ref else None,
    )
    return tb, torch.rand(B, generator=g), [0, 1, 0, 1, 0, 1, 0, 1]  # groups interleaved


def _estimate(toml, tb, rewards, groups):
    alg = load_config_text(f"[algorithm]\ngroup_size = {N}\n{toml}").algorithm
    return registry.resolve(alg.estimator.compute)(AdvantageInputs(tb, rewards, groups, alg)).advantages_BT


def _whiten(x, mask):
    """verl's masked whitening: unbiased variance, eps 1e-8 under the root."""
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = (((x - mean) * mask) ** 2).sum() / (n - 1)
    return (x - mean) * torch.rsqrt(var + 1e-8) * mask


def test_rloo_is_the_reward_minus_the_mean_of_the_other_responses():
    tb, r, groups = _rows()
    adv = _estimate("name = 'rloo'", tb, r, groups)
    g = torch.tensor(groups)
    for b in range(B):
        others = r[(g == g[b]) & (torch.arange(B) != b)]
        torch.testing.assert_close(adv[b], (r[b] - others.mean()) * tb.response_mask[b])


def test_reinforce_plus_plus_whitens_the_discounted_return_of_the_last_token_reward():
    tb, r, groups = _rows()
    adv = _estimate("name = 'reinforce_plus_plus'\ngamma = 0.9", tb, r, groups)
    mask = tb.response_mask
    returns = torch.zeros(B, T)
    for b in range(B):
        last = int(mask[b].sum()) - 1
        for t in range(last + 1):
            returns[b, t] = r[b] * 0.9 ** (last - t)
    torch.testing.assert_close(adv, _whiten(returns, mask), rtol=1e-5, atol=1e-6)


def test_reinforce_plus_plus_puts_the_kl_on_every_tokens_reward_with_kl_in_reward():
    tb, r, groups = _rows(1, ref=True)
    adv = _estimate("name = 'reinforce_plus_plus'\nkl_coef = 0.1\nkl_in_reward = true\nkl_estimator = 'k1'", tb, r, groups)
    mask = tb.response_mask
    kl = (tb.rollout_logp - tb.ref_logp) * mask  # k1
    token_r = -0.1 * kl
    for b in range(B):
        token_r[b, int(mask[b].sum()) - 1] += r[b]
    returns = token_r.flip(1).cumsum(1).flip(1) * mask  # gamma = 1
    torch.testing.assert_close(adv, _whiten(returns, mask), rtol=1e-5, atol=1e-6)


def test_reinforce_plus_plus_baseline_whitens_the_group_centred_reward_over_tokens():
    tb, r, groups = _rows(2)
    adv = _estimate("name = 'reinforce_plus_plus_baseline'", tb, r, groups)
    g = torch.tensor(groups)
    centred = torch.stack([r[b] - r[g == g[b]].mean() for b in range(B)])
    torch.testing.assert_close(adv, _whiten(centred[:, None] * tb.response_mask, tb.response_mask), rtol=1e-5, atol=1e-6)


def test_each_estimator_says_what_it_needs():
    assert registry.ESTIMATORS["rloo"].grouped and registry.ESTIMATORS["reinforce_plus_plus_baseline"].grouped
    rpp = registry.ESTIMATORS["reinforce_plus_plus"]
    assert not (rpp.grouped or rpp.needs_critic)
