"""CISPO (algorithms/cispo.py, ``[algorithm.loss] name = "cispo"``): the clipped importance
weight, without gradient, times the log-prob (MiniMax-M1, eq. 4), checked against that
formula computed here; every token keeps a gradient, clipped or not; the config selects
it by name through the registry alone."""

from __future__ import annotations

import pytest
import torch
from loss_inputs import grad, inputs, registry_loss

from asyncflow.algorithms import registry
from asyncflow.algorithms.loss_configs import CISPOLoss
from asyncflow.config.load import ConfigError, load_config_text

pytestmark = pytest.mark.timeout(30)


def _formula(logp, mu, adv, mask, low, high):
    """-sg(clip(pi / mu, 1 - low, 1 + high)) A log pi, token mean."""
    w = torch.exp(logp - mu).clamp(1 - low, 1 + high).detach()
    return (-w * adv * logp * mask).sum() / mask.sum()


@pytest.mark.parametrize(("low", "high"), [(0.2, 0.28), (1.0, 4.0)])
def test_cispo_is_the_clipped_weight_without_gradient_times_the_log_prob(low, high):
    logp, mu, adv, mask = inputs(0, spread=0.5)
    toml = f"[algorithm.loss]\nname = 'cispo'\nclip_low = {low}\nclip_high = {high}\n"
    loss, metrics = registry_loss(toml, logp, mu, adv, mask)
    ref_logp = logp.detach().clone().requires_grad_(True)
    ref = _formula(ref_logp, mu, adv, mask, low, high)
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad(loss, logp), grad(ref, ref_logp), rtol=1e-6, atol=1e-7)
    ratio = torch.exp(logp.detach() - mu)
    clipped = ((ratio < 1 - low) | (ratio > 1 + high)).float()
    assert metrics["clip_frac"] == pytest.approx(float((clipped * mask).sum() / mask.sum()), abs=1e-6)


def test_a_clipped_token_still_has_a_gradient_unlike_ppo_clip():
    logp, mu, adv, mask = inputs(1, spread=2.0)  # ratios far outside 1 +- 0.28
    g = grad(registry_loss("[algorithm.loss]\nname = 'cispo'\n", logp, mu, adv, mask)[0], logp)
    ratio = torch.exp(logp.detach() - mu)
    far = (mask > 0) & (ratio > 10) & (adv != 0)
    assert far.any() and (g[far] != 0).all()
    assert (g[mask == 0] == 0).all()


def test_the_config_selects_cispo_by_name_and_checks_its_bounds():
    cfg = load_config_text("[algorithm.loss]\nname = 'cispo'\n")
    assert isinstance(cfg.algorithm.loss, CISPOLoss) and registry.loss_name(cfg.algorithm.loss) == "cispo"
    with pytest.raises(ConfigError, match="algorithm.loss.clip_low"):
        load_config_text("[algorithm.loss]\nname = 'cispo'\nclip_low = 1.5\n")
    with pytest.raises(ConfigError, match="dual_clip: unknown key"):
        load_config_text("[algorithm.loss]\nname = 'cispo'\ndual_clip = 3.0\n")
