"""The trainer's figures of the training/inference mismatch, taken before the update."""

import math

import pytest
from policy_helpers import columns, policy_update

from asyncflow.actors.runtime.batching import token_batch

PROMPTS = [[8, 9, 10], [8, 9, 10], [11, 12, 13], [11, 12, 13]]
RESPONSES = [[14, 15, 16, 2], [17, 18, 19, 2], [20, 21, 22, 2], [23, 24, 25, 2]]


@pytest.mark.parametrize("epochs", [1, 3])
def test_a_step_reports_the_mismatch_of_its_data_before_any_update(tiny_model_dir, epochs):
    policy = policy_update(tiny_model_dir, {"algorithm": {"epochs": epochs}, "train.engine": {"lr": 1e-2}})
    tb, starts = token_batch(PROMPTS, RESPONSES)
    prox_BT = policy.engine.forward(tb, temperature=policy.temperature).logp
    # The rollout gave every sampled token half the trainer's probability: pi_prox / mu = 2.
    mu = [(prox_BT[b, s : s + len(r)] - math.log(2)).tolist() for b, (s, r) in enumerate(zip(starts, RESPONSES))]
    metrics = policy.train(columns(PROMPTS, RESPONSES, [1.0, 0.0, 0.0, 1.0], mu), [0, 0, 1, 1])
    for name in ("ratio_p05", "ratio_p50", "ratio_p95"):
        assert metrics[name] == pytest.approx(2.0, rel=1e-4)
    assert metrics["mismatch_kl"] == pytest.approx(1 - math.log(2), rel=1e-3)
    assert metrics["is_masked_frac"] == 0.0


def test_the_algorithm_section_sets_the_weight_level_and_the_mask():
    from tiny_config import tiny_config_text

    from asyncflow.algorithms.grpo import ppo_clip_config as loss_config
    from asyncflow.config.load import load_config_text

    alg = load_config_text(
        tiny_config_text({"algorithm": {"is_level": "sequence", "is_mask_low": 0.5, "is_mask_high": 2.0}})
    ).algorithm
    cfg = loss_config(alg)
    assert (cfg.is_level, cfg.is_mask_low, cfg.is_mask_high) == ("sequence", 0.5, 2.0)
