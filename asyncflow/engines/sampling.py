"""Token sampling with the log-prob of the sampled token.

Shape legend: B sequences, V vocabulary.

Invariant: the returned log-prob is ``log_softmax(logits / temperature)`` at the
sampled token, before top-k/top-p truncation (temperature 0: greedy, log-prob at
temperature 1). A trainer recomputing log-probs with the same temperature gets the
same numbers; truncation only changes which tokens can be drawn.
"""

from __future__ import annotations

import torch

from asyncflow.engines.config import SamplingParams


def sample(
    logits_BV: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (token_B int64, logp_B float32)."""
    logits_BV = logits_BV.float()
    if params.temperature == 0.0:
        token_B = logits_BV.argmax(dim=-1)
        logp_BV = torch.log_softmax(logits_BV, dim=-1)
        return token_B, logp_BV.gather(1, token_B.unsqueeze(1)).squeeze(1)
    scaled_BV = logits_BV / params.temperature
    logp_BV = torch.log_softmax(scaled_BV, dim=-1)
    draw_BV = scaled_BV
    if params.top_k > 0 and params.top_k < draw_BV.shape[-1]:
        kth_B1 = torch.topk(draw_BV, params.top_k, dim=-1).values[:, -1:]
        draw_BV = draw_BV.masked_fill(draw_BV < kth_B1, float("-inf"))
    if params.top_p < 1.0:
        sorted_BV, order_BV = torch.sort(draw_BV, dim=-1, descending=True)
        cum_BV = torch.softmax(sorted_BV, dim=-1).cumsum(dim=-1)
        # Drop a token when the mass before it already reaches top_p (the first stays).
        drop_sorted_BV = (cum_BV - torch.softmax(sorted_BV, dim=-1)) >= params.top_p
        drop_BV = torch.zeros_like(drop_sorted_BV).scatter(1, order_BV, drop_sorted_BV)
        draw_BV = draw_BV.masked_fill(drop_BV, float("-inf"))
    probs_BV = torch.softmax(draw_BV, dim=-1) if draw_BV is not scaled_BV else logp_BV.exp()
    token_B = draw(probs_BV, generator)
    return token_B, logp_BV.gather(1, token_B.unsqueeze(1)).squeeze(1)


def draw(probs_BV: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row with probability ``probs_BV`` (rows need not sum to one), by
    the inverse of the cumulative distribution: one uniform number per row and a
    binary search. ``torch.multinomial`` draws an exponential number for every entry,
    which over a 49k vocabulary was 12% of a real-size rollout on a CPU (a quarter of
    a decode step's matmuls). The sum runs in float64, and the search takes the first
    entry whose cumulative sum is strictly above the draw, so an entry of probability
    zero (cut by top-k/top-p) is never drawn."""
    cdf_BV = probs_BV.double().cumsum(dim=-1)
    u_B1 = torch.rand((probs_BV.shape[0], 1), generator=generator, dtype=torch.float64, device=probs_BV.device)
    token_B = torch.searchsorted(cdf_BV, u_B1 * cdf_BV[:, -1:], right=True).squeeze(1)
    return token_B.clamp_(max=probs_BV.shape[-1] - 1)
