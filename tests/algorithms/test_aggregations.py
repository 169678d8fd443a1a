"""Dr. GRPO's aggregations (``agg = "seq-mean-token-sum-norm"``, ``"token-sum"``), checked
against their formulas on random tensors, over micro-batches and for every loss that has
``agg``; settable from ``[algorithm.loss]``."""

from __future__ import annotations

import pytest
import torch
from loss_inputs import grad, inputs, registry_loss

from asyncflow.algorithms.losses import aggregate
from asyncflow.engines.base import LossContext

pytestmark = pytest.mark.timeout(30)


def test_token_sum_is_the_sum_over_response_tokens_and_sums_over_micro_batches_and_ranks():
    x = torch.randn(6, 9)
    _, _, _, mask = inputs(0)
    assert torch.allclose(aggregate(x, mask, "token-sum"), (x * mask).sum())
    ctx = LossContext(num_tokens=float(mask.sum()), num_seqs=6.0, dp_size=2)
    # each of two ranks' losses times dp_size: the gradient average over ranks is the sum
    parts = aggregate(x[:3], mask[:3], "token-sum", ctx) + aggregate(x[3:], mask[3:], "token-sum", ctx)
    assert torch.allclose(parts / 2, (x * mask).sum())


def test_seq_mean_token_sum_norm_divides_by_a_constant_horizon_not_by_lengths():
    x = torch.randn(6, 9)
    _, _, _, mask = inputs(0)
    want = (x * mask).sum() / (6 * 1024)
    assert torch.allclose(aggregate(x, mask, "seq-mean-token-sum-norm", horizon=1024), want)
    ctx = LossContext(num_tokens=float(mask.sum()), num_seqs=6.0)
    parts = aggregate(x[:2], mask[:2], "seq-mean-token-sum-norm", ctx, 1024) + aggregate(
        x[2:], mask[2:], "seq-mean-token-sum-norm", ctx, 1024
    )
    assert torch.allclose(parts, want)
    with pytest.raises(ValueError, match="horizon"):
        aggregate(x, mask, "seq-mean-token-sum-norm")


@pytest.mark.parametrize("loss", ["ppo_clip", "cispo"])
@pytest.mark.parametrize("agg", ["token-sum", "seq-mean-token-sum-norm"])
def test_dr_grpo_aggregations_go_from_the_toml_to_the_loss(loss, agg):
    logp, mu, adv, mask = inputs(2, spread=0.1)
    toml = f"[algorithm.loss]\nname = '{loss}'\nagg = '{agg}'\n"
    got, _ = registry_loss(toml, logp, mu, adv, mask, horizon=16)
    per_token, _ = registry_loss(f"[algorithm.loss]\nname = '{loss}'\nagg = 'token-mean'\n", logp, mu, adv, mask, horizon=16)
    scale = mask.sum() if agg == "token-sum" else mask.sum() / (6 * 16)  # token-mean -> token-sum -> / (B horizon)
    torch.testing.assert_close(got, per_token * scale, rtol=1e-5, atol=1e-7)
    assert grad(got, logp).abs().sum() > 0
