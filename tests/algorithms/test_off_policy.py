"""Off-policy corrections of the policy loss: what the ratio is clipped against,
importance weights, masks, and the mismatch metrics."""

import math

import pytest

from asyncflow.algorithms.grpo import PolicyLossConfig, policy_loss_fn
from asyncflow.engines.base import LossContext
from test_grpo_ppo import one_row

ONE_TOKEN = LossContext(num_tokens=1, num_seqs=1)


def test_clipping_against_the_behaviour_policy_clips_pi_over_mu_with_no_separate_weight():
    # pi = 0.9, mu = 0.5: pi / mu = 1.8, clipped at 1 + 0.2.
    out, mb = one_row([math.log(0.9)], advantages=[1.0], rollout_logp=[math.log(0.5)])
    loss, metrics = policy_loss_fn(PolicyLossConfig(clip_against="behaviour", tis_cap=2.0))(out, mb, ONE_TOKEN)
    assert loss.item() == pytest.approx(-1.2)
    assert metrics["clip_frac"] == 1.0 and "is_weight" not in metrics


def test_clipping_against_the_proximal_policy_leaves_the_staleness_to_the_weight():
    # The same token: ratio pi / pi_prox = 1, weight min(pi_prox / mu, 2) = 1.8.
    out, mb = one_row([math.log(0.9)], advantages=[1.0], rollout_logp=[math.log(0.5)])
    loss, metrics = policy_loss_fn(PolicyLossConfig(clip_against="proximal", tis_cap=2.0))(out, mb, ONE_TOKEN)
    assert loss.item() == pytest.approx(-1.8)
    assert metrics["clip_frac"] == 0.0 and metrics["is_weight"] == pytest.approx(1.8)


def test_clipping_against_the_behaviour_policy_without_rollout_logprobs_names_the_key():
    out, mb = one_row([0.0], advantages=[1.0])
    with pytest.raises(ValueError, match="clip_against"):
        policy_loss_fn(PolicyLossConfig(clip_against="behaviour"))(out, mb, ONE_TOKEN)


def test_the_algorithm_section_chooses_what_the_ratio_is_clipped_against():
    from asyncflow.actors._policy import loss_config
    from asyncflow.core.config import load_config_text
    from tiny_config import tiny_config_text

    cfg = load_config_text(tiny_config_text({"algorithm": {"clip_against": "behaviour"}}))
    assert loss_config(cfg.algorithm).clip_against == "behaviour"
    assert loss_config(load_config_text(tiny_config_text()).algorithm).clip_against == "proximal"


def test_an_unknown_clip_against_value_names_the_key_and_the_choices():
    from asyncflow.core.config import ConfigError, load_config_text
    from tiny_config import tiny_config_text

    with pytest.raises(ConfigError, match=r"algorithm.clip_against.*'proximal', 'behaviour'"):
        load_config_text(tiny_config_text({"algorithm": {"clip_against": "coupled"}}))
