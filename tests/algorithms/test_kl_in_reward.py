"""algorithm.kl_in_reward: the KL to the reference moves into the reward, for GRPO as for PPO."""

import math

import pytest
from policy_helpers import columns, policy_update

from asyncflow.engines.base import TrainStepResult


def advantages_of_one_step(policy, cols, group_ids):
    """The advantages the policy loss would see (the optimizer step is skipped)."""
    seen = {}

    def train_step(tb, loss_fn, temperature=1.0, top_k=0, top_p=1.0):
        seen["advantages_BT"], seen["mask_BT"] = tb.advantages, tb.response_mask
        return TrainStepResult(loss=0.0, grad_norm=0.0, num_tokens=0, metrics={}, step=1)

    policy.engine.train_step = train_step
    metrics = policy.train(cols, group_ids)
    return seen["advantages_BT"], seen["mask_BT"], metrics


def test_grpo_with_kl_in_reward_penalises_the_row_that_strays_from_the_reference(tiny_model_dir):
    # Two responses of one prompt with equal rewards: no advantage without the KL.
    # Row 1 was sampled at log-prob log(0.5) where the reference gives log(0.25) (k1 KL
    # log 2 per token, 2 tokens); row 0 agrees with the reference.
    half, quarter = math.log(0.5), math.log(0.25)
    cols = columns(
        [[8, 9], [8, 9]],
        [[10, 11], [12, 13]],
        [1.0, 1.0],
        rollout_logp=[[half, half], [half, half]],
        ref_logp=[[half, half], [quarter, quarter]],
    )
    coef = 0.1
    policy = policy_update(
        tiny_model_dir, {"algorithm": {"kl_coef": coef, "kl_in_reward": True, "kl_estimator": "k1", "std_normalize": False}}
    )
    adv_BT, mask_BT, metrics = advantages_of_one_step(policy, cols, [0, 0])
    seq_kl = 2 * math.log(2)
    # Rewards 1 and 1 - coef * seq_kl, centred on their mean (Dr. GRPO: no std division).
    assert adv_BT[0][mask_BT[0] > 0].tolist() == pytest.approx([coef * seq_kl / 2] * 2)
    assert adv_BT[1][mask_BT[1] > 0].tolist() == pytest.approx([-coef * seq_kl / 2] * 2)
    assert metrics["kl"] == pytest.approx(math.log(2) / 2)


def test_grpo_with_kl_in_reward_puts_no_kl_term_in_the_loss(tiny_model_dir):
    from asyncflow.algorithms.grpo import ppo_clip_config as loss_config

    policy = policy_update(tiny_model_dir, {"algorithm": {"kl_coef": 0.1, "kl_in_reward": True}})
    assert loss_config(policy.cfg.algorithm).kl_coef == 0.0
