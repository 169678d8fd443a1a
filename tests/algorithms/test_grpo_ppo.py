import math

import pytest
import torch

from asyncflow.algorithms.advantages import gae, last_token_rewards
from asyncflow.algorithms.grpo import PolicyLossConfig, policy_loss_fn
from asyncflow.algorithms.ppo import PPOConfig, critic_loss_fn, ppo_advantages
from asyncflow.engines.base import ForwardOutput, LossContext, TokenBatch


def one_row(logp, **fields) -> tuple[ForwardOutput, TokenBatch]:
    logp_BT = torch.tensor([logp], requires_grad=True)
    n = len(logp)
    mb = TokenBatch(
        input_ids=torch.zeros(1, n, dtype=torch.long),
        attention_mask=torch.ones(1, n, dtype=torch.long),
        response_mask=torch.ones(1, n),
        **{k: torch.tensor([v]) for k, v in fields.items()},
    )
    return ForwardOutput(logp=logp_BT, entropy=torch.tensor([[0.5] * n])), mb


def test_grpo_loss_weights_stale_tokens_by_truncated_importance_ratio():
    half, quarter = math.log(0.5), math.log(0.25)
    out, mb = one_row([half, half], advantages=[1.0, -1.0], rollout_logp=[quarter, half])
    loss, metrics = policy_loss_fn(PolicyLossConfig(tis_cap=2.0))(out, mb, LossContext(num_tokens=2, num_seqs=1))
    # ratio to prox is 1; w = min(0.5 / 0.25, 2) = 2 and 1: token losses -2 and +1, mean -0.5
    assert loss.item() == pytest.approx(-0.5)
    assert metrics["is_weight"] == pytest.approx(1.5)
    loss.backward()
    assert out.logp.grad[0].tolist() == pytest.approx([-1.0, 0.5])


def test_grpo_loss_stays_bounded_on_samples_many_versions_old():
    # The rollout policy gave these tokens probability 1e-6: the raw ratio is 5e5.
    out, mb = one_row([math.log(0.5)], advantages=[1.0], rollout_logp=[math.log(1e-6)])
    loss, metrics = policy_loss_fn(PolicyLossConfig(tis_cap=2.0))(out, mb, LossContext(num_tokens=1, num_seqs=1))
    assert loss.item() == pytest.approx(-2.0) and metrics["is_truncated_frac"] == 1.0


def test_grpo_loss_adds_kl_and_entropy_terms_by_hand():
    out, mb = one_row([math.log(0.5)], advantages=[0.0], ref_logp=[math.log(0.25)])
    cfg = PolicyLossConfig(kl_coef=0.1, kl_estimator="k1", entropy_coef=0.01)
    loss, metrics = policy_loss_fn(cfg)(out, mb, LossContext(num_tokens=1, num_seqs=1))
    assert loss.item() == pytest.approx(0.1 * math.log(2) - 0.01 * 0.5)
    assert metrics["kl"] == pytest.approx(math.log(2))


def test_grpo_loss_with_a_proximal_policy_clips_the_ratio():
    out, mb = one_row([math.log(0.9)], advantages=[1.0], prox_logp=[math.log(0.5)])
    loss, metrics = policy_loss_fn(PolicyLossConfig(clip_high=0.2))(out, mb, LossContext(num_tokens=1, num_seqs=1))
    assert loss.item() == pytest.approx(-1.2) and metrics["clip_frac"] == 1.0


def test_kl_without_reference_logprobs_says_what_to_set():
    out, mb = one_row([0.0], advantages=[0.0])
    with pytest.raises(ValueError, match="kl_coef = 0"):
        policy_loss_fn(PolicyLossConfig(kl_coef=0.1))(out, mb, LossContext(num_tokens=1, num_seqs=1))


def test_critic_loss_clips_values_around_rollout_values():
    values = torch.tensor([[1.0, 0.6]], requires_grad=True)
    mb = TokenBatch(
        input_ids=torch.zeros(1, 2, dtype=torch.long),
        attention_mask=torch.ones(1, 2, dtype=torch.long),
        response_mask=torch.ones(1, 2),
        returns=torch.tensor([[2.0, 0.0]]),
        old_values=torch.tensor([[0.5, 0.5]]),
    )
    loss, _ = critic_loss_fn(PPOConfig(value_clip=0.2))(
        ForwardOutput(logp=torch.zeros(1, 2), values=values), mb, LossContext(2, 1)
    )
    assert loss.item() == pytest.approx((0.845 + 0.18) / 2)


def test_ppo_advantages_put_the_reward_last_and_subtract_the_kl_per_token():
    mask = torch.tensor([[0.0, 1, 1]])
    values = torch.tensor([[0.0, 0.2, 0.4]])
    logp = torch.log(torch.tensor([[1.0, 0.5, 0.5]]))
    ref = torch.log(torch.tensor([[1.0, 0.25, 0.5]]))
    cfg = PPOConfig(gamma=1.0, lam=1.0, kl_in_reward_coef=0.1, kl_estimator="k1", whiten_advantages=False)
    adv, ret = ppo_advantages(cfg, torch.tensor([1.0]), values, mask, logp, ref)
    # token rewards: [0, -0.1 log 2, 1]; returns-to-go: [., 1 - 0.0693, 1]
    assert ret[0].tolist() == pytest.approx([0.0, 1 - 0.1 * math.log(2), 1.0], abs=1e-6)
    assert adv[0].tolist() == pytest.approx([0.0, 1 - 0.1 * math.log(2) - 0.2, 0.6], abs=1e-6)
    plain, _ = gae(last_token_rewards(torch.tensor([1.0]), mask), values, mask, 1.0, 1.0)
    assert plain[0, 2].item() == pytest.approx(0.6)
