"""Advantages of gateway sessions: GRPO within keyed groups, leave-one-out over the batch's lone sessions."""

import pytest
import torch

from asyncflow.algorithms.estimators import AdvantageInputs
from asyncflow.config.algorithm import AlgorithmConfig
from asyncflow.engines.base import TokenBatch


def batch(num_rows: int) -> TokenBatch:
    mask = torch.ones(num_rows, 2)
    return TokenBatch(input_ids=torch.zeros(num_rows, 2, dtype=torch.long), attention_mask=mask.long(), response_mask=mask)


@pytest.mark.timeout(30)
def test_lone_sessions_get_the_leave_one_out_mean_of_the_other_lone_sessions_and_groups_grpo():
    from asyncflow.algorithms.session_baseline import session_advantages

    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0])  # rows 0, 1: group 7; rows 2, 3, 4: lone
    alg = AlgorithmConfig(group_size=2)
    adv = session_advantages(AdvantageInputs(batch(5), rewards, [7, 7, 11, 12, 13], alg)).advantages_BT[:, 0]
    g = 1 / (torch.tensor([1.0, 0.0]).std() + 1e-6)
    assert adv.tolist() == pytest.approx([float(g) * 0.5, -float(g) * 0.5, 1.0, -0.5, -0.5])


@pytest.mark.timeout(30)
def test_a_batch_with_one_lone_session_gives_it_no_advantage():
    from asyncflow.algorithms.session_baseline import session_advantages

    adv = session_advantages(AdvantageInputs(batch(1), torch.tensor([1.0]), [3], AlgorithmConfig())).advantages_BT
    assert adv.abs().sum() == 0
