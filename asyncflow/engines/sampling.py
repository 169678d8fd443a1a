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
    token_B = torch.multinomial(probs_BV, 1, generator=generator).squeeze(1)
    return token_B, logp_BV.gather(1, token_B.unsqueeze(1)).squeeze(1)
