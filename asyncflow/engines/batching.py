"""Pack ragged rollout samples into a right-padded ``TokenBatch`` for training.

Shape legend: B samples, T = longest prompt + response.

Invariants:
- Row b is ``prompt_b + response_b`` then padding; ``response_mask`` is 1 exactly on
  the response tokens, so log-probs, advantages and losses line up with the rollout
  engine's per-token outputs (``logp_BT[b, len(prompt_b) + i] = logprobs_b[i]``).
- Per-sequence scalars (advantages) are broadcast over the response tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from asyncflow.engines.base import TokenBatch


def make_token_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_token_id: int,
    rollout_logprobs: Sequence[Sequence[float]] | None = None,
    advantages_B: torch.Tensor | None = None,
    ref_logprobs: Sequence[Sequence[float]] | None = None,
) -> TokenBatch:
    """A training batch from per-sample prompt ids, response ids and (optionally)
    their rollout log-probs, sequence advantages and reference log-probs."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses; give one prompt per response")
    B = len(prompts)
    T = max(len(p) + len(r) for p, r in zip(prompts, responses))
    ids_BT = torch.full((B, T), pad_token_id, dtype=torch.long)
    attn_BT = torch.zeros((B, T), dtype=torch.long)
    resp_BT = torch.zeros((B, T), dtype=torch.float32)
    rollout_BT = torch.zeros((B, T), dtype=torch.float32) if rollout_logprobs is not None else None
    ref_BT = torch.zeros((B, T), dtype=torch.float32) if ref_logprobs is not None else None
    for b, (p, r) in enumerate(zip(prompts, responses)):
        n_p, n = len(p), len(p) + len(r)
        ids_BT[b, :n] = torch.tensor(list(p) + list(r), dtype=torch.long)
        attn_BT[b, :n] = 1
        resp_BT[b, n_p:n] = 1.0
        if rollout_BT is not None and rollout_logprobs is not None:
            rollout_BT[b, n_p:n] = torch.tensor(rollout_logprobs[b], dtype=torch.float32)
        if ref_BT is not None and ref_logprobs is not None:
            ref_BT[b, n_p:n] = torch.tensor(ref_logprobs[b], dtype=torch.float32)
    adv_BT = advantages_B.float().unsqueeze(1) * resp_BT if advantages_B is not None else None
    return TokenBatch(
        input_ids=ids_BT,
        attention_mask=attn_BT,
        response_mask=resp_BT,
        rollout_logp=rollout_BT,
        ref_logp=ref_BT,
        advantages=adv_BT,
    )
