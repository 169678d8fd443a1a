"""Overlong shaping: the soft length penalty (``algorithm.overlong_buffer``,
``overlong_penalty``) and dropping truncated responses from the loss
(``algorithm.mask_truncated``), from the pure functions to a PolicyUpdate step on the
tiny model."""

from __future__ import annotations

import pytest
import torch
from policy_helpers import columns, policy_update
from tiny_config import tiny_config_text

from asyncflow.actors.runtime.batching import token_batch
from asyncflow.algorithms.grpo import PolicyLossConfig, policy_loss_fn
from asyncflow.algorithms.overlong import drop_rows, overlong_penalty, truncated_rows
from asyncflow.config.load import ConfigError, load_config_text
from asyncflow.engines.base import ForwardOutput, LossContext, TokenBatch, TrainStepResult

pytestmark = pytest.mark.timeout(120)

# examples/tiny.toml: rollout.sampling.max_new_tokens = 4, algorithm.group_size = 2
PROMPTS = [[8, 9, 10], [8, 9, 10], [11, 12, 13], [11, 12, 13]]
RESPONSES = [[14, 15, 2], [17, 18, 19, 20], [21, 22, 2], [23, 24, 25, 2]]
LOGP = [[-1.0] * len(r) for r in RESPONSES]


# -- the penalty ---------------------------------------------------------------------------


def test_the_penalty_is_zero_up_to_the_buffer_and_falls_linearly_to_minus_the_penalty_at_max_new_tokens():
    lengths = torch.tensor([0, 5, 6, 7, 8, 9, 10])
    penalty = overlong_penalty(lengths, max_new_tokens=10, buffer=4, penalty=0.5)
    assert penalty.tolist() == pytest.approx([0.0, 0.0, 0.0, -0.125, -0.25, -0.375, -0.5])


def test_the_penalty_never_goes_below_minus_the_penalty_and_a_zero_buffer_is_no_penalty():
    assert overlong_penalty(torch.tensor([12, 100]), 10, 4, 0.5).tolist() == [-0.5, -0.5]
    assert overlong_penalty(torch.tensor([0, 9, 10]), 10, 0, 0.5).tolist() == [0.0, 0.0, 0.0]
    # a buffer of 1: only a response of exactly max_new_tokens pays, in full
    assert overlong_penalty(torch.tensor([8, 9, 10]), 10, 1, 2.0).tolist() == [0.0, 0.0, -2.0]


def test_truncated_rows_are_those_whose_finish_is_0():
    cols = columns(PROMPTS, RESPONSES, [0.0] * 4, LOGP, truncated=[False, True, False, True])
    assert truncated_rows(cols["finish"]).tolist() == [False, True, False, True]


# -- the config ----------------------------------------------------------------------------


def test_overlong_shaping_is_off_by_default():
    alg = load_config_text(tiny_config_text()).algorithm
    assert (alg.overlong_buffer, alg.mask_truncated) == (0, False)


def test_a_buffer_that_is_not_below_max_new_tokens_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"algorithm\.overlong_buffer = 4: .*below 4"):
        load_config_text(tiny_config_text({"algorithm": {"overlong_buffer": 4}}))
    with pytest.raises(ConfigError, match=r"algorithm\.overlong_penalty = -1.0: out of range"):
        load_config_text(tiny_config_text({"algorithm": {"overlong_penalty": -1.0}}))
    alg = load_config_text(
        tiny_config_text({"algorithm": {"overlong_buffer": 3, "overlong_penalty": 0.5, "mask_truncated": True}})
    ).algorithm
    assert (alg.overlong_buffer, alg.overlong_penalty, alg.mask_truncated) == (3, 0.5, True)


# -- the masked loss, on the loss function --------------------------------------------------


def _batch(mask_BT: torch.Tensor, adv_B: torch.Tensor) -> TokenBatch:
    B, T = mask_BT.shape
    return TokenBatch(
        input_ids=torch.zeros(B, T, dtype=torch.long),
        attention_mask=torch.ones(B, T, dtype=torch.long),
        response_mask=mask_BT,
        advantages=adv_B.unsqueeze(1) * mask_BT,
        rollout_logp=torch.full((B, T), -1.2) * mask_BT,
    )


def _loss_and_grad(mask_BT: torch.Tensor, adv_B: torch.Tensor, logp_BT: torch.Tensor, agg: str):
    """The policy loss of the batch normalised like the engine does (LossContext from
    the mask), and the gradient on the log-probs."""
    logp_BT = logp_BT.clone().requires_grad_(True)
    ctx = LossContext(num_tokens=float(mask_BT.sum()), num_seqs=float((mask_BT.sum(dim=1) > 0).sum()))
    loss, _ = policy_loss_fn(PolicyLossConfig(agg=agg))(ForwardOutput(logp=logp_BT), _batch(mask_BT, adv_B), ctx)  # type: ignore[arg-type]
    loss.backward()
    return float(loss.detach()), logp_BT.grad


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_a_dropped_row_gets_no_gradient_and_the_other_rows_loss_is_as_without_it(agg):
    torch.manual_seed(0)
    mask_BT = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 1, 1, 1], [0, 0, 1, 1, 0]], dtype=torch.float32)
    adv_B = torch.tensor([1.0, -2.0, 0.5])
    logp_BT = -torch.rand(3, 5)
    drop_B = torch.tensor([False, True, False])
    loss, grad = _loss_and_grad(drop_rows(mask_BT, drop_B), adv_B, logp_BT, agg)
    assert grad[1].abs().sum() == 0.0  # the dropped row: no gradient at all
    assert grad[0].abs().sum() > 0 and grad[2].abs().sum() > 0
    # rows 0 and 2 alone: the same loss, and the same gradient on their tokens
    kept = [0, 2]
    loss_alone, grad_alone = _loss_and_grad(mask_BT[kept], adv_B[kept], logp_BT[kept], agg)
    assert loss == pytest.approx(loss_alone, rel=1e-6)
    torch.testing.assert_close(grad[kept], grad_alone)
    # and it is not the loss of all three rows: the drop changed something
    loss_all, _ = _loss_and_grad(mask_BT, adv_B, logp_BT, agg)
    assert loss_all != pytest.approx(loss, rel=1e-3)


# -- a PolicyUpdate step ----------------------------------------------------------------------


def _advantages_and_mask(policy, cols, group_ids):
    """The batch the policy loss would see (the optimizer step is skipped)."""
    seen = {}

    def train_step(tb, loss_fn, temperature=1.0, top_k=0, top_p=1.0):
        seen["advantages_BT"], seen["mask_BT"] = tb.advantages.clone(), tb.response_mask.clone()
        return TrainStepResult(loss=0.0, grad_norm=0.0, num_tokens=0, metrics={}, step=1)

    policy.engine.train_step = train_step
    policy.train(cols, group_ids)
    return seen["advantages_BT"], seen["mask_BT"]


def _row_advantage(adv_BT, mask_BT, b):
    return adv_BT[b][mask_BT[b] > 0].unique().tolist()


def test_the_length_penalty_goes_into_the_reward_before_the_group_advantage(tiny_model_dir):
    # Equal rewards in each group: no advantage without shaping. max_new_tokens 4, buffer 2,
    # penalty 1: a 3-token response pays 0.5, a 4-token one 1.
    cols = columns(PROMPTS, RESPONSES, [1.0, 1.0, 1.0, 1.0], LOGP)
    plain = policy_update(tiny_model_dir, {"algorithm": {"std_normalize": False}})
    adv_BT, _ = _advantages_and_mask(plain, cols, [0, 0, 1, 1])
    assert adv_BT.abs().sum() == 0.0
    shaped = policy_update(tiny_model_dir, {"algorithm": {"std_normalize": False, "overlong_buffer": 2}})
    adv_BT, mask_BT = _advantages_and_mask(shaped, cols, [0, 0, 1, 1])
    # group 0: rewards 1 - 0.5 and 1 - 1 -> centred +-0.25; group 1: 0.5 and 0 -> +-0.25
    assert [_row_advantage(adv_BT, mask_BT, b) for b in range(4)] == [[0.25], [-0.25], [0.25], [-0.25]]
    figures = shaped.batch_figures(cols)
    assert figures["overlong_penalty_mean"] == pytest.approx((0.5 + 1.0 + 0.5 + 1.0) / 4)
    assert figures["reward_mean"] == 1.0  # the reward functions' score, before shaping
    assert plain.batch_figures(cols)["overlong_penalty_mean"] == 0.0


def test_mask_truncated_drops_only_the_truncated_rows_after_their_group_advantage(tiny_model_dir):
    cols = columns(PROMPTS, RESPONSES, [1.0, 0.0, 0.0, 1.0], LOGP, truncated=[False, True, False, False])
    plain = policy_update(tiny_model_dir, {"algorithm": {"std_normalize": False}})
    adv_plain, mask_plain = _advantages_and_mask(plain, cols, [0, 0, 1, 1])
    masked = policy_update(tiny_model_dir, {"algorithm": {"std_normalize": False, "mask_truncated": True}})
    adv_masked, mask_masked = _advantages_and_mask(masked, cols, [0, 0, 1, 1])
    assert mask_masked[1].sum() == 0 and mask_plain[1].sum() == 4  # the truncated row: out of the loss
    torch.testing.assert_close(mask_masked[[0, 2, 3]], mask_plain[[0, 2, 3]])  # the others: untouched
    # row 0's advantage still counts its truncated group mate's reward
    assert _row_advantage(adv_masked, mask_masked, 0) == _row_advantage(adv_plain, mask_plain, 0) == [0.5]
    figures = masked.batch_figures(cols)
    assert (figures["truncated_frac"], figures["truncated_masked_frac"]) == (0.25, 0.25)
    figures = plain.batch_figures(cols)
    assert (figures["truncated_frac"], figures["truncated_masked_frac"]) == (0.25, 0.0)


def _gradient_per_row(policy, cols, group_ids):
    """One real optimizer step; the gradient of the loss on each row's log-probs
    (summed |grad| over its tokens) and the step's token count the loss divided by."""
    seen: list[tuple[torch.Tensor, int]] = []
    counts: list[float] = []
    loss_fn = policy.loss_fn

    def spy(out, mb, ctx):
        out.logp.retain_grad()
        seen.append(out.logp)
        counts.append(ctx.num_tokens)
        return loss_fn(out, mb, ctx)

    policy.loss_fn = spy
    policy.train(cols, group_ids)
    return torch.cat([logp.grad.abs().sum(dim=1) for logp in seen]), counts[0]


def _on_policy_logp(policy) -> list[list[float]]:
    """The policy's own log-probs of RESPONSES: the ratio pi / mu is 1, nothing is clipped."""
    tb, starts = token_batch(PROMPTS, RESPONSES)
    logp_BT = policy.engine.forward(tb, temperature=policy.temperature).logp
    return [logp_BT[b, s : s + len(r)].tolist() for b, (s, r) in enumerate(zip(starts, RESPONSES))]


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_a_truncated_row_gets_no_gradient_through_the_engine_with_mask_truncated(tiny_model_dir, name):
    changes = {"algorithm": {"name": name, "mask_truncated": True}}
    mu = _on_policy_logp(policy_update(tiny_model_dir, changes))
    cols = columns(PROMPTS, RESPONSES, [1.0, 0.0, 0.0, 1.0], mu, truncated=[False, True, False, False])
    grad_B, num_tokens = _gradient_per_row(policy_update(tiny_model_dir, changes), cols, [0, 0, 1, 1])
    assert grad_B[1] == 0.0 and (grad_B[[0, 2, 3]] > 0).all()
    assert num_tokens == 3 + 3 + 4  # the token mean runs over the remaining rows' tokens
    changes["algorithm"]["mask_truncated"] = False
    grad_B, num_tokens = _gradient_per_row(policy_update(tiny_model_dir, changes), cols, [0, 0, 1, 1])
    assert grad_B[1] > 0 and num_tokens == 3 + 4 + 3 + 4
