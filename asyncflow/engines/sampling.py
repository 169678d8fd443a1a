"""Token sampling with the log-prob of the sampled token, and the truncation rule
(top-k, top-p) that the trainer applies again to its own logits.

Shape legend: B sequences (or token positions), V vocabulary.

Invariant: the returned log-prob is that of the distribution the token was drawn
from: ``log_softmax`` of ``logits / temperature`` with every token outside the kept
set (``keep_mask``: top-k, then top-p of what top-k left) at minus infinity
(temperature 0: greedy, the log-prob at temperature 1, untruncated). A trainer that
recomputes the log-prob of the same token with the same temperature and the same
rule on its own logits (``truncated_logits``, ``torch_train.shift_logp``) gets the
same number, so an on-policy ratio is 1 on every token. vLLM's
``logprobs_mode = "processed_logprobs"`` records the same quantity
(engines/vllm_requests.py).
"""

from __future__ import annotations

import torch

from asyncflow.engines.config import SamplingParams


def truncates(top_k: int, top_p: float, vocab: int) -> bool:
    """Whether the rule cuts anything at this vocabulary size."""
    return 0 < top_k < vocab or top_p < 1.0


@torch.no_grad()
def keep_mask(scaled_BV: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The tokens a draw may take (bool, [B, V]): the ``top_k`` most likely (0: all),
    then the smallest set of those whose mass reaches ``top_p`` of what top-k left
    (the most likely token always stays). ``scaled_BV``: logits over temperature."""
    keep_BV = torch.ones_like(scaled_BV, dtype=torch.bool)
    if 0 < top_k < scaled_BV.shape[-1]:
        kth_B1 = torch.topk(scaled_BV, top_k, dim=-1).values[:, -1:]
        keep_BV &= scaled_BV >= kth_B1
    if top_p < 1.0:
        masked_BV = scaled_BV.masked_fill(~keep_BV, float("-inf"))
        sorted_BV, order_BV = torch.sort(masked_BV, dim=-1, descending=True)
        probs_BV = torch.softmax(sorted_BV, dim=-1)
        # drop a token when the mass before it already reaches top_p (the first stays)
        drop_sorted_BV = (probs_BV.cumsum(dim=-1) - probs_BV) >= top_p
        keep_BV &= ~torch.zeros_like(drop_sorted_BV).scatter(1, order_BV, drop_sorted_BV)
    return keep_BV


def truncated_logits(scaled_BV: torch.Tensor, top_k: int, top_p: float, token_B: torch.Tensor | None = None) -> torch.Tensor:
    """``scaled_BV`` with the tokens ``keep_mask`` cuts at minus infinity (differentiable
    through the kept ones). ``token_B``: tokens known to have been drawn, kept even where
    this side's numbers would cut them (a trainer's logits differ from the sampler's by
    rounding at the edge of the set), so their log-prob stays finite."""
    keep_BV = keep_mask(scaled_BV, top_k, top_p)
    if token_B is not None:
        keep_BV.scatter_(1, token_B.unsqueeze(1), True)
    return scaled_BV.masked_fill(~keep_BV, float("-inf"))


def sample(
    logits_BV: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (token_B int64, logp_B float32): the log-prob under the distribution
    the token was drawn from (module docstring)."""
    logits_BV = logits_BV.float()
    if params.temperature == 0.0:
        token_B = logits_BV.argmax(dim=-1)
        logp_BV = torch.log_softmax(logits_BV, dim=-1)
        return token_B, logp_BV.gather(1, token_B.unsqueeze(1)).squeeze(1)
    scaled_BV = logits_BV / params.temperature
    if truncates(params.top_k, params.top_p, scaled_BV.shape[-1]):
        scaled_BV = truncated_logits(scaled_BV, params.top_k, params.top_p)
    logp_BV = torch.log_softmax(scaled_BV, dim=-1)
    token_B = draw(logp_BV.exp(), generator)
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
