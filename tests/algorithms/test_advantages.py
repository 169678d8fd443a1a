import math

import pytest
import torch

from asyncflow.algorithms.advantages import broadcast_to_tokens, gae, grpo_advantages, last_token_rewards, masked_whiten


def test_grpo_advantages_divide_centred_rewards_by_the_unbiased_group_std():
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 4.0, 3.0, 3.0]]))
    # group 1: mean 0.5, std sqrt(4 * 0.25 / 3) = 0.57735; group 2: mean 3, std sqrt(2 / 3) = 0.81650
    assert adv[0].tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)
    assert adv[1].tolist() == pytest.approx([-1.224745, 1.224745, 0.0, 0.0], abs=1e-5)


def test_grpo_advantages_without_std_are_the_centred_rewards():
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.1, 0.4, 0.7, 1.0]]), divide_by_std=False)
    assert adv[0].tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert adv[1].tolist() == pytest.approx([-0.45, -0.15, 0.15, 0.45], abs=1e-6)


def test_groups_of_equal_rewards_or_of_one_sample_get_exactly_zero():
    assert grpo_advantages(torch.full((2, 8), 0.1)).abs().max().item() == 0.0
    assert grpo_advantages(torch.tensor([[0.7], [0.2]])).tolist() == [[0.0], [0.0]]


def test_gae_by_hand_with_lambda_one_half():
    mask = torch.tensor([[0.0, 1, 1, 1, 0]])
    rewards = torch.tensor([[0.0, 0, 0, 1, 0]])
    values = torch.tensor([[9.0, 0.5, 0.6, 0.8, 9.0]])  # 9s sit off the mask and must not leak
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    # A3 = 1 - 0.8 = 0.2; A2 = (0.8 - 0.6) + 0.5 * 0.2 = 0.3; A1 = (0.6 - 0.5) + 0.5 * 0.3 = 0.25
    assert adv[0].tolist() == pytest.approx([0.0, 0.25, 0.3, 0.2, 0.0])
    assert ret[0].tolist() == pytest.approx([0.0, 0.75, 0.9, 1.0, 0.0])


def test_gae_with_lambda_one_is_the_discounted_return_minus_the_value():
    mask = torch.tensor([[1.0, 1, 1]])
    adv, ret = gae(torch.tensor([[0.0, 0, 1]]), torch.tensor([[0.5, 0.6, 0.8]]), mask, gamma=0.9, lam=1.0)
    assert adv[0].tolist() == pytest.approx([0.81 - 0.5, 0.9 - 0.6, 1.0 - 0.8])
    assert ret[0].tolist() == pytest.approx([0.81, 0.9, 1.0])


def test_sequence_rewards_go_on_the_last_response_token():
    out = last_token_rewards(torch.tensor([2.0, 3.0, 5.0]), torch.tensor([[0.0, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]]))
    assert out.tolist() == [[0, 0, 2, 0], [0, 0, 0, 0], [0, 0, 0, 5]]


def test_broadcast_and_whiten_respect_the_mask():
    mask = torch.tensor([[1.0, 1, 1, 0]])
    assert broadcast_to_tokens(torch.tensor([1.5]), mask).tolist() == [[1.5, 1.5, 1.5, 0.0]]
    white = masked_whiten(torch.tensor([[1.0, 2.0, 3.0, 100.0]]), mask)
    s = math.sqrt(3 / 2)  # (x - 2) / sqrt(2/3)
    assert white[0].tolist() == pytest.approx([-s, 0.0, s, 0.0], abs=1e-5)
