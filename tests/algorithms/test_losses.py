import math

import pytest
import torch

from asyncflow.algorithms.losses import aggregate, clipped_policy_loss, clipped_value_loss, entropy_bonus
from asyncflow.engines.base import LossContext


def test_clipped_policy_loss_by_hand():
    # ratios 1.5, 1.5, 0.5, 0.5 against advantages +1, -1, +1, -1, clip 0.2
    logp = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))
    prox = torch.zeros(4)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, clipped = clipped_policy_loss(logp, prox, adv, 0.2, 0.2)
    # max(-A r, -A clip(r)): max(-1.5, -1.2), max(1.5, 1.2), max(-0.5, -0.8), max(0.5, 0.8)
    assert loss.tolist() == pytest.approx([-1.2, 1.5, -0.5, 0.8])
    assert clipped.tolist() == [1.0, 0.0, 0.0, 1.0]


def test_asymmetric_and_dual_clip_by_hand():
    logp = torch.log(torch.tensor([1.5, 5.0]))
    loss, _ = clipped_policy_loss(logp, torch.zeros(2), torch.tensor([1.0, -1.0]), clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    # +A: max(-1.5, -1.28) = -1.28; -A with r = 5: max(5, 1.28) = 5, bounded by -A c = 3
    assert loss.tolist() == pytest.approx([-1.28, 3.0])


def test_policy_gradient_at_ratio_one_is_minus_advantage_times_weight():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    loss, _ = clipped_policy_loss(logp, logp.detach(), torch.tensor([2.0, -0.5]))
    loss.sum().backward()
    assert logp.grad.tolist() == pytest.approx([-2.0, 0.5])


def test_clipped_value_loss_by_hand():
    values = torch.tensor([1.0, 0.6])
    old = torch.tensor([0.5, 0.5])
    returns = torch.tensor([2.0, 0.0])
    loss, clipped = clipped_value_loss(values, old, returns, clip=0.2)
    # token 0: max((1-2)^2, (0.7-2)^2) / 2 = 0.845; token 1: inside the clip, 0.36 / 2 = 0.18
    assert loss.tolist() == pytest.approx([0.845, 0.18])
    assert clipped.tolist() == [1.0, 0.0]
    plain, _ = clipped_value_loss(values, old, returns, clip=None)
    assert plain.tolist() == pytest.approx([0.5, 0.18])


def test_aggregation_modes_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)


def test_aggregation_with_step_totals_sums_to_the_step_mean_across_micro_batches_and_ranks():
    ctx = LossContext(num_tokens=8.0, num_seqs=4.0, dp_size=2)
    part = aggregate(torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3), "token-mean", ctx)
    assert part.item() == pytest.approx(6 / 8 * 2)  # FSDP then averages over the 2 ranks
    part = aggregate(torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3), "seq-mean-token-mean", ctx)
    assert part.item() == pytest.approx(2 / 4 * 2)


def test_entropy_bonus_rewards_entropy():
    assert entropy_bonus(torch.tensor([math.log(2)]), coef=0.01).item() == pytest.approx(-0.01 * math.log(2))
