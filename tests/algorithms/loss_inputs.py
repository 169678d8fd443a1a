"""Random loss inputs shared by the loss tests: rows of different lengths, a policy
moved from the rollout's, advantages of both signs, and the loss as the registry builds it."""

from __future__ import annotations

import torch

from asyncflow.algorithms import registry
from asyncflow.config.load import load_config_text
from asyncflow.engines.base import ForwardOutput, LossContext, TokenBatch

B, T = 6, 9
LENGTHS = [9, 5, 1, 7, 3, 8]


def inputs(seed: int = 0, spread: float = 0.5):
    """(logp with grad, mu, advantages per token, mask), [B, T] each."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).float()
    mu = -torch.rand(B, T, generator=g) * 3
    logp = (mu + spread * torch.randn(B, T, generator=g)).requires_grad_(True)
    adv = torch.randn(B, generator=g)[:, None].expand(B, T) * mask
    return logp, mu * mask, adv.contiguous(), mask


def batch(mu, adv, mask, **extra) -> TokenBatch:
    return TokenBatch(
        input_ids=torch.zeros(B, T, dtype=torch.long),
        attention_mask=torch.ones(B, T),
        response_mask=mask,
        rollout_logp=mu,
        advantages=adv,
        extra=dict(extra),
    )


def registry_loss(toml: str, logp, mu, adv, mask, horizon: int = 0, **extra):
    """The loss and metrics of the registry's builder for ``toml`` (an ``[algorithm]``
    text), on one micro-batch that is the whole step; the loss is found by name only."""
    alg = load_config_text(toml).algorithm
    build = registry.resolve(registry.policy_loss(registry.loss_name(alg.loss)).build)
    loss_fn = build(alg, None, horizon=horizon)
    ctx = LossContext(num_tokens=float(mask.sum()), num_seqs=float((mask.sum(1) > 0).sum()))
    return loss_fn(ForwardOutput(logp=logp), batch(mu, adv, mask, **extra), ctx)


def grad(loss, logp):
    (g,) = torch.autograd.grad(loss, logp)
    return g
