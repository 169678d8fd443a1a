"""Rows from the queue -> a right-padded TokenBatch for a training engine.

Shape legend: B rows, T = longest prompt + response. Row b holds its prompt at
``[0, P_b)`` and its response at ``[P_b, P_b + L_b)``; per-response columns
(``rollout_logp``, ``ref_logp``) are placed at the response positions, matching the
engines' convention that ``logp_BT[b, t]`` is the log-prob of token t.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from asyncflow.engines.base import TokenBatch


def token_batch(
    prompt_ids: Sequence[np.ndarray],
    response_ids: Sequence[np.ndarray],
    per_token: dict[str, Sequence[np.ndarray]] | None = None,
) -> tuple[TokenBatch, list[int]]:
    """The batch and each row's response start. ``per_token[name][b]`` has one value
    per response token; it becomes field ``name`` of the TokenBatch ([B, T], 0 elsewhere)."""
    B = len(prompt_ids)
    starts = [len(p) for p in prompt_ids]
    T = max(len(p) + len(r) for p, r in zip(prompt_ids, response_ids))
    ids_BT = torch.zeros(B, T, dtype=torch.long)
    attn_BT = torch.zeros(B, T, dtype=torch.long)
    resp_BT = torch.zeros(B, T, dtype=torch.float32)
    extra_BT = {name: torch.zeros(B, T, dtype=torch.float32) for name in (per_token or {})}
    for b, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        P, L = len(p), len(r)
        ids_BT[b, :P] = torch.as_tensor(np.array(p, dtype=np.int64))  # a copy: queue arrays are read-only
        ids_BT[b, P : P + L] = torch.as_tensor(np.array(r, dtype=np.int64))
        attn_BT[b, : P + L] = 1
        resp_BT[b, P : P + L] = 1.0
        for name, col in (per_token or {}).items():
            extra_BT[name][b, P : P + L] = torch.as_tensor(np.array(col[b], dtype=np.float32))
    batch = TokenBatch(input_ids=ids_BT, attention_mask=attn_BT, response_mask=resp_BT)
    for name, value in extra_BT.items():
        setattr(batch, name, value)
    return batch, starts
