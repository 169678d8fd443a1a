"""Off-policy corrections of the policy loss: what the ratio is clipped against,
importance weights, masks, and the mismatch metrics."""

import math

import pytest
import torch
from test_grpo_ppo import one_row

from asyncflow.algorithms.grpo import PolicyLossConfig, policy_loss_fn
from asyncflow.algorithms.off_policy import is_log_ratio, keep_mask, ratio_quantiles, truncated_weights
from asyncflow.engines.base import ForwardOutput, LossContext, TokenBatch

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
    from tiny_config import tiny_config_text

    from asyncflow.algorithms.grpo import ppo_clip_config as loss_config
    from asyncflow.config.load import load_config_text

    cfg = load_config_text(tiny_config_text({"algorithm": {"clip_against": "proximal"}}))
    assert loss_config(cfg.algorithm).clip_against == "proximal"
    assert loss_config(load_config_text(tiny_config_text()).algorithm).clip_against == "behaviour"


def test_an_unknown_clip_against_value_names_the_key_and_the_choices():
    from tiny_config import tiny_config_text

    from asyncflow.config.load import ConfigError, load_config_text

    with pytest.raises(ConfigError, match=r"algorithm.clip_against.*'proximal', 'behaviour'"):
        load_config_text(tiny_config_text({"algorithm": {"clip_against": "coupled"}}))


def test_token_level_importance_weights_are_truncated_per_token():
    prox_BT = torch.log(torch.tensor([[0.6, 0.2, 0.5]]))
    mu_BT = torch.log(torch.tensor([[0.2, 0.4, 0.5]]))
    log_w_BT = is_log_ratio(prox_BT, mu_BT, torch.ones(1, 3), "token")
    assert truncated_weights(log_w_BT, cap=2.0)[0].tolist() == pytest.approx([2.0, 0.5, 1.0])


def test_a_sequence_level_ratio_is_the_product_of_its_token_ratios_on_every_token():
    # Row 0: ratios 2 and 1.5 -> 3 on both tokens; row 1: one token of ratio 0.5, then padding.
    prox_BT = torch.log(torch.tensor([[0.6, 0.6], [0.1, 0.9]]))
    mu_BT = torch.log(torch.tensor([[0.3, 0.4], [0.2, 0.1]]))
    mask_BT = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    log_w_BT = is_log_ratio(prox_BT, mu_BT, mask_BT, "sequence")
    assert torch.exp(log_w_BT).flatten().tolist() == pytest.approx([3.0, 3.0, 0.5, 1.0])
    assert truncated_weights(log_w_BT, cap=2.0).flatten().tolist() == pytest.approx([2.0, 2.0, 0.5, 1.0])


def test_the_loss_weights_every_token_of_a_stale_sequence_by_the_sequence_ratio():
    # Token ratios 2 and 1: one weight 2 for both tokens (token level: 2 and 1).
    out, mb = one_row([math.log(0.6), math.log(0.5)], advantages=[1.0, 1.0], rollout_logp=[math.log(0.3), math.log(0.5)])
    ctx = LossContext(num_tokens=2, num_seqs=1)
    loss, metrics = policy_loss_fn(PolicyLossConfig(is_level="sequence", tis_cap=3.0))(out, mb, ctx)
    assert loss.item() == pytest.approx(-2.0) and metrics["is_weight"] == pytest.approx(2.0)
    loss, metrics = policy_loss_fn(PolicyLossConfig(is_level="token", tis_cap=3.0))(out, mb, ctx)
    assert loss.item() == pytest.approx(-1.5) and metrics["is_weight"] == pytest.approx(1.5)


def test_the_mask_keeps_ratios_inside_its_bounds_only():
    log_r_BT = torch.log(torch.tensor([[3.0, 1.0, 0.2, 2.0, 0.5]]))
    assert keep_mask(log_r_BT, low=0.5, high=2.0).tolist() == [[0.0, 1.0, 0.0, 1.0, 1.0]]


def test_masked_tokens_are_dropped_from_the_policy_gradient_and_counted():
    # pi_prox / mu = 3, 1, 0.2, 1.5 against bounds [0.5, 2]: tokens 0 and 2 are dropped.
    prox = [math.log(0.6), math.log(0.5), math.log(0.1), math.log(0.6)]
    mu = [math.log(0.2), math.log(0.5), math.log(0.5), math.log(0.4)]
    out, mb = one_row(prox, advantages=[1.0] * 4, rollout_logp=mu)
    cfg = PolicyLossConfig(tis_cap=0.0, is_mask_low=0.5, is_mask_high=2.0)
    loss, metrics = policy_loss_fn(cfg)(out, mb, LossContext(num_tokens=4, num_seqs=1))
    assert loss.item() == pytest.approx(-0.5) and metrics["is_masked_frac"] == pytest.approx(0.5)
    loss.backward()
    assert out.logp.grad[0].tolist() == pytest.approx([0.0, -0.25, 0.0, -0.25])


def test_a_sequence_level_mask_drops_the_whole_sequence_whose_product_leaves_the_bounds():
    # Token ratios 1.8 and 1.8 stay inside [0.5, 2]; their product 3.24 does not.
    out, mb = one_row([math.log(0.9)] * 2, advantages=[1.0] * 2, rollout_logp=[math.log(0.5)] * 2)
    ctx = LossContext(num_tokens=2, num_seqs=1)
    for level, masked in (("token", 0.0), ("sequence", 1.0)):
        cfg = PolicyLossConfig(tis_cap=0.0, is_level=level, is_mask_low=0.5, is_mask_high=2.0)
        _, metrics = policy_loss_fn(cfg)(out, mb, ctx)
        assert metrics["is_masked_frac"] == masked


def test_mismatch_kl_is_the_k3_estimate_of_kl_from_mu_to_pi_prox():
    # Sampled by mu with probability 0.25, pi_prox gives 0.5: r = 2, k3 = (r - 1) - log r.
    out, mb = one_row([math.log(0.5)], advantages=[0.0], rollout_logp=[math.log(0.25)])
    _, metrics = policy_loss_fn(PolicyLossConfig())(out, mb, ONE_TOKEN)
    assert metrics["mismatch_kl"] == pytest.approx(1 - math.log(2))


def test_mismatch_figures_summed_over_micro_batches_are_the_step_means():
    loss_fn = policy_loss_fn(PolicyLossConfig(is_mask_low=0.5, is_mask_high=2.0))
    step = LossContext(num_tokens=2, num_seqs=2)
    # Micro-batch 1: ratio 4 (masked); micro-batch 2: ratio 1.
    parts = [
        one_row([math.log(0.8)], advantages=[1.0], rollout_logp=[math.log(0.2)]),
        one_row([math.log(0.5)], advantages=[1.0], rollout_logp=[math.log(0.5)]),
    ]
    figures = [loss_fn(out, mb, step)[1] for out, mb in parts]
    assert sum(f["is_masked_frac"] for f in figures) == pytest.approx(0.5)
    assert sum(f["mismatch_kl"] for f in figures) == pytest.approx((3 - math.log(4)) / 2)


def test_the_loss_hands_each_response_tokens_log_ratio_to_a_sink_for_quantiles():
    sink: list[torch.Tensor] = []
    loss_fn = policy_loss_fn(PolicyLossConfig(), log_ratio_sink=sink)
    out = ForwardOutput(logp=torch.log(torch.tensor([[0.5, 0.5, 0.5]])))
    mb = TokenBatch(
        input_ids=torch.zeros(1, 3, dtype=torch.long),
        attention_mask=torch.ones(1, 3, dtype=torch.long),
        response_mask=torch.tensor([[0.0, 1.0, 1.0]]),
        advantages=torch.zeros(1, 3),
        rollout_logp=torch.log(torch.tensor([[0.5, 0.25, 0.5]])),
    )
    loss_fn(out, mb, LossContext(num_tokens=2, num_seqs=1))
    assert torch.cat(sink).exp().tolist() == pytest.approx([2.0, 1.0])


def test_ratio_quantiles_are_nearest_rank_quantiles_of_the_token_ratios():
    log_r_N = torch.log(torch.arange(1, 102, dtype=torch.float32))  # ratios 1..101
    assert ratio_quantiles(log_r_N) == pytest.approx({"ratio_p05": 6.0, "ratio_p50": 51.0, "ratio_p95": 96.0})
    assert ratio_quantiles(torch.zeros(0)) == {}


def test_a_mask_bound_of_zero_leaves_that_side_open():
    # Ratios 3 and 0.2: a lower bound alone drops only the 0.2, an upper bound alone only the 3.
    out, mb = one_row([math.log(0.6), math.log(0.1)], advantages=[1.0] * 2, rollout_logp=[math.log(0.2), math.log(0.5)])
    ctx = LossContext(num_tokens=2, num_seqs=1)
    for low, high in ((0.5, 0.0), (0.0, 2.0)):
        _, metrics = policy_loss_fn(PolicyLossConfig(tis_cap=0.0, is_mask_low=low, is_mask_high=high))(out, mb, ctx)
        assert metrics["is_masked_frac"] == 0.5
