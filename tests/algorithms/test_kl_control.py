"""The adaptive KL controller (algorithms/kl_control.py, ``[algorithm.kl_ctrl] type =
"adaptive"``): Ziegler et al.'s proportional rule, checked against the formula computed
here; the trainer trains each step with the controller's coefficient and updates it
from the batch's KL; the fixed controller (the default) never moves."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from policy_helpers import columns, policy_update

from asyncflow.algorithms import registry
from asyncflow.algorithms.kl_control import AdaptiveKL, controller
from asyncflow.config.load import ConfigError, load_config_text

pytestmark = pytest.mark.timeout(120)


def test_the_adaptive_coefficient_follows_the_proportional_rule():
    ctrl = controller(AdaptiveKL(target_kl=0.1, horizon=1000), 0.05)
    value = 0.05
    for kl, n in [(0.3, 64), (0.12, 64), (0.01, 32), (0.1, 64)]:
        ctrl.update(kl, n)
        value *= 1 + float(np.clip(kl / 0.1 - 1, -0.2, 0.2)) * n / 1000
        assert ctrl.value == pytest.approx(value, rel=1e-12)


def test_the_fixed_controller_keeps_kl_coef():
    cfg = load_config_text("[algorithm]\nkl_coef = 0.02\n")
    ctrl = controller(cfg.algorithm.kl_ctrl, cfg.algorithm.kl_coef)
    ctrl.update(5.0, 1000)
    assert ctrl.value == 0.02 and registry.KL_CONTROLLERS["fixed"] is type(cfg.algorithm.kl_ctrl)


def test_an_adaptive_controller_needs_a_starting_coefficient():
    with pytest.raises(ConfigError, match="algorithm.kl_ctrl"):
        load_config_text("[algorithm.kl_ctrl]\ntype = 'adaptive'\n")
    cfg = load_config_text(
        "[algorithm]\nkl_coef = 0.01\n[algorithm.kl_ctrl]\ntype = 'adaptive'\ntarget_kl = 0.2\nhorizon = 500\n"
    )
    assert cfg.algorithm.kl_ctrl == AdaptiveKL(target_kl=0.2, horizon=500)


def test_the_trainer_updates_the_coefficient_from_the_batchs_kl(tiny_model_dir):
    changes = {"algorithm": {"kl_coef": 0.05, "kl_in_reward": True, "kl_estimator": "k1", "group_size": 2}}
    policy = policy_update(
        tiny_model_dir, {**changes, "algorithm.kl_ctrl": {"type": "adaptive", "target_kl": 0.1, "horizon": 100}}
    )
    mu = [[-1.0, -2.0, -0.5], [-1.5, -0.2]]
    ref = [[-1.2, -2.5, -0.4], [-1.0, -0.9]]
    cols = columns([[1, 2], [1, 2]], [[3, 4, 5], [6, 7]], [1.0, 0.0], mu, ref)
    out = policy.train(cols, [0, 0])
    kl = np.mean([np.mean(np.subtract(m, r)) for m, r in zip(mu, ref)])  # k1 = log mu - log ref, seq-mean-token-mean
    assert kl > 0.1
    assert out["kl_coef"] == pytest.approx(0.05) and policy.kl_ctrl.value == pytest.approx(0.05 * (1 + 0.2 * 2 / 100))
    assert torch.isfinite(torch.tensor(out["loss"]))
