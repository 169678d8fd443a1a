import math

import pytest
import torch

from asyncflow.algorithms.kl import kl_per_token

LOGP = torch.tensor([math.log(0.5), math.log(0.3)])
REF = torch.tensor([math.log(0.25), math.log(0.3)])


def test_k1_is_the_negative_log_ratio():
    assert kl_per_token(LOGP, REF, "k1").tolist() == pytest.approx([math.log(2), 0.0], abs=1e-6)


def test_k2_is_half_the_squared_log_ratio():
    assert kl_per_token(LOGP, REF, "k2").tolist() == pytest.approx([0.5 * math.log(2) ** 2, 0.0], abs=1e-6)


def test_k3_is_ratio_minus_one_minus_log_ratio():
    # r = 0.25 / 0.5 = 0.5: (0.5 - 1) - log 0.5 = 0.193147
    assert kl_per_token(LOGP, REF, "k3").tolist() == pytest.approx([0.5 - 1 + math.log(2), 0.0], abs=1e-6)


def test_k3_is_bounded_by_the_clamp_itself_as_verl_bounds_it():
    """verl's low_var_kl: log r within +-20 (no overflow), then k3 within [-10, 10]."""
    assert kl_per_token(torch.tensor([-100.0]), torch.tensor([0.0]), "k3", clamp=10.0).item() == 10.0
    assert kl_per_token(torch.tensor([0.0]), torch.tensor([-100.0]), "k3", clamp=10.0).item() == 10.0  # e^-20 - 1 + 20, bounded
    small = kl_per_token(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]), "k3", clamp=10.0)
    assert small.item() == pytest.approx(0.5 - 1 + math.log(2), abs=1e-6)  # inside the bound: unchanged


def test_one_wild_token_cannot_rank_a_right_answer_below_a_wrong_one_with_kl_in_the_reward():
    """The issue's repro: kl_coef 0.001, rewards [1, 1, 0, 1], one token of row 1 with
    log mu = -14 and log ref = -2. Unbounded, its k3 (e^10 - 11 = 22,015) put the right
    row 1 below the wrong row 2; bounded as verl bounds it, the advantages are verl's."""
    from asyncflow.algorithms.advantages import grpo_advantages
    from asyncflow.algorithms.kl import kl_penalized_rewards

    logp = torch.full((4, 3), -1.0)
    ref = torch.full((4, 3), -1.0)
    logp[1, 1], ref[1, 1] = -14.0, -2.0
    rewards = kl_penalized_rewards(torch.tensor([1.0, 1.0, 0.0, 1.0]), logp, ref, torch.ones(4, 3), 0.001, "k3")
    adv = grpo_advantages(rewards.view(1, 4)).view(-1)
    assert adv.tolist() == pytest.approx([0.51, 0.49, -1.50, 0.51], abs=0.01)


def test_unknown_estimator_names_the_choices():
    with pytest.raises(ValueError, match="'k1', 'k2' or 'k3'"):
        kl_per_token(LOGP, REF, "k4")


def test_kl_in_the_reward_subtracts_the_summed_response_kl():
    from asyncflow.algorithms.kl import kl_penalized_rewards

    logp = torch.log(torch.tensor([[1.0, 0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.1, 0.25, 0.5]]))  # the prompt token (mask 0) must not count
    out = kl_penalized_rewards(torch.tensor([1.0]), logp, ref, torch.tensor([[0.0, 1.0, 1.0]]), coef=0.1, estimator="k1")
    assert out.tolist() == pytest.approx([1.0 - 0.1 * math.log(2)])
