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


def test_k3_stays_finite_for_wild_log_ratios_thanks_to_the_clamp():
    value = kl_per_token(torch.tensor([-100.0]), torch.tensor([0.0]), "k3", clamp=10.0)
    assert value.item() == pytest.approx(math.exp(10) - 1 - 10, rel=1e-5)


def test_unknown_estimator_names_the_choices():
    with pytest.raises(ValueError, match="'k1', 'k2' or 'k3'"):
        kl_per_token(LOGP, REF, "k4")


def test_kl_in_the_reward_subtracts_the_summed_response_kl():
    from asyncflow.algorithms.kl import kl_penalized_rewards

    logp = torch.log(torch.tensor([[1.0, 0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.1, 0.25, 0.5]]))  # the prompt token (mask 0) must not count
    out = kl_penalized_rewards(torch.tensor([1.0]), logp, ref, torch.tensor([[0.0, 1.0, 1.0]]), coef=0.1, estimator="k1")
    assert out.tolist() == pytest.approx([1.0 - 0.1 * math.log(2)])
