"""Decoupled PPO with the log-linear proximal approximation (algorithms/decoupled.py):
pi_prox as AReaL's formula places it between mu and pi by version, then PPO's clip
against it times the truncated weight pi_prox / mu; selected by name."""

from __future__ import annotations

import pytest
import torch
from loss_inputs import B, T, grad, inputs, registry_loss

from asyncflow.algorithms import registry
from asyncflow.config.load import ConfigError, load_config_text

pytestmark = pytest.mark.timeout(30)

TOML = "[algorithm]\nclip_against = 'proximal'\nis_truncation = 2.0\n[algorithm.loss]\nname = 'decoupled_ppo'\nclip_high = 0.28\n"


def _formula(logp, mu, adv, mask, d, low=0.2, high=0.28, cap=2.0):
    """alpha = clamp((v_prox - v_mu) / (v_theta - v_mu), 0, 1), v_prox = v_theta - 1;
    log prox = mu + alpha (sg(logp) - mu); loss = min(prox / mu, cap) max(-A r, -A clip(r)), r = pi / prox."""
    alpha = torch.where(d > 0, (d - 1) / d.clamp(min=1), torch.zeros_like(d)).clamp(0, 1)
    prox = mu + alpha * (logp.detach() - mu)
    r = torch.exp(logp - prox)
    pg = torch.maximum(-adv * r, -adv * r.clamp(1 - low, 1 + high))
    w = torch.exp(prox - mu).clamp(max=cap)
    return (w * pg * mask).sum() / mask.sum()


def test_the_loss_is_ppo_clip_against_the_interpolated_proximal_policy():
    logp, mu, adv, mask = inputs(0, spread=0.3)
    d = torch.randint(0, 5, (B, 1), generator=torch.Generator().manual_seed(3)).float().expand(B, T) * mask
    loss, _ = registry_loss(TOML, logp, mu, adv, mask, staleness=d)
    ref_logp = logp.detach().clone().requires_grad_(True)
    ref = _formula(ref_logp, mu, adv, mask, d)
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad(loss, logp), grad(ref, ref_logp), rtol=1e-6, atol=1e-7)


def test_a_token_one_version_old_has_prox_equal_to_mu_and_a_fresh_one_prox_equal_to_pi():
    from asyncflow.algorithms.decoupled import loglinear_prox

    mu, pi = torch.full((1, 4), -2.0), torch.full((1, 4), -1.0)
    prox = loglinear_prox(mu, pi, torch.tensor([[0.0, 1.0, 2.0, 4.0]]))
    torch.testing.assert_close(prox, torch.tensor([[-2.0, -2.0, -1.5, -1.25]]))


def test_decoupled_ppo_needs_the_proximal_clip_and_the_trainer_skips_the_forward_pass():
    with pytest.raises(ConfigError, match='clip_against = "proximal"'):
        load_config_text("[algorithm.loss]\nname = 'decoupled_ppo'\n")
    entry = registry.policy_loss(registry.loss_name(load_config_text(TOML).algorithm.loss))
    assert entry.needs_staleness and not entry.recompute_prox
    logp, mu, adv, mask = inputs(0)
    with pytest.raises(ValueError, match="staleness"):
        registry_loss(TOML, logp, mu, adv, mask)


def test_the_trainer_gives_the_loss_each_tokens_staleness_and_runs_no_prox_forward_pass(tiny_model_dir, monkeypatch):
    from policy_helpers import columns, policy_update

    import asyncflow.algorithms.decoupled as decoupled

    changes = {
        "algorithm": {"clip_against": "proximal", "epochs": 2, "group_size": 2},
        "algorithm.loss": {"name": "decoupled_ppo"},
    }
    policy = policy_update(tiny_model_dir, changes)
    seen = []
    real = decoupled.loglinear_prox
    monkeypatch.setattr(decoupled, "loglinear_prox", lambda mu, logp, d: seen.append(d.clone()) or real(mu, logp, d))
    monkeypatch.setattr(policy.engine, "forward", lambda *a, **k: pytest.fail("pi_prox was recomputed"))
    cols = columns([[1, 2], [1, 2, 3]], [[4, 5, 6], [7, 8]], [1.0, 0.0], [[-1.0, -2.0, -0.5], [-1.5, -0.2]])
    policy.train(cols, [0, 0], versions=[3, 5], step=6)
    d = seen[0]
    assert sorted(d[0][d[0] > 0].tolist()) == [3.0, 3.0, 3.0] and d[1][d[1] > 0].tolist() == [1.0, 1.0]
