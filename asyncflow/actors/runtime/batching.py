"""Rows from the queue -> a right-padded TokenBatch for a training engine.

Shape legend: B rows, T = longest prompt + response. Row b holds its prompt at
``[0, P_b)`` and its response at ``[P_b, P_b + L_b)``; per-response columns
(``rollout_logp``, ``ref_logp``) are placed at the response positions, matching the
engines' convention that ``logp_BT[b, t]`` is the log-prob of token t.

Multi-turn rows (``loss_mask``, docs/environments.md): ``response_mask`` is the loss
mask on the response positions, so observation tokens inserted between turns are
context only; without it every response token counts (single-turn, as before).

The trainer's token budget is the model's context: ``fit_to_budget`` cuts a longer row
to it before batching (its tokens past the budget are not trained, it counts as not
finished), so one over-long trajectory costs a counted, logged cut rather than the
trainer's memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from asyncflow.engines.base import TokenBatch

RESPONSE_COLUMNS = ("response_ids", "rollout_logp", "ref_logp", "loss_mask", "token_versions")
"""The columns of one value per response token: cut with ``response_ids``."""


def fit_to_budget(columns: Mapping[str, Sequence], budget: int) -> tuple[dict[str, list], list[int]]:
    """``columns`` with every row longer than ``budget`` tokens (prompt + response) cut
    to it: its response columns end at the budget (a prompt past it too: no response
    left) and its ``finish`` is 0. Returns the columns (the other rows' arrays as they
    were) and the positions of the rows cut. ``budget`` 0: no limit."""
    out = {name: list(col) for name, col in columns.items()}
    if not budget:
        return out, []
    cut = [b for b, (p, r) in enumerate(zip(columns["prompt_ids"], columns["response_ids"])) if len(p) + len(r) > budget]
    for b in cut:
        keep = max(budget - len(out["prompt_ids"][b]), 0)
        out["prompt_ids"][b] = out["prompt_ids"][b][:budget]
        for name in RESPONSE_COLUMNS:
            if name in out:
                out[name][b] = out[name][b][:keep]
        if "finish" in out:
            out["finish"][b] = np.zeros_like(out["finish"][b])
    return out, cut


def token_batch(
    prompt_ids: Sequence[np.ndarray],
    response_ids: Sequence[np.ndarray],
    per_token: Mapping[str, Sequence[np.ndarray]] | None = None,
    loss_mask: Sequence[np.ndarray] | None = None,
) -> tuple[TokenBatch, list[int]]:
    """The batch and each row's response start. ``per_token[name][b]`` has one value
    per response token; it becomes field ``name`` of the TokenBatch ([B, T], 0 elsewhere).
    ``loss_mask[b]`` (one 0/1 per response token) becomes the response mask of row b.

    Vectorised: each column is one concatenation and one scatter into the padded
    array (no per-row tensor ops); the queue's arrays are only read."""
    B = len(prompt_ids)
    P_B = np.fromiter((len(p) for p in prompt_ids), dtype=np.int64, count=B)
    L_B = np.fromiter((len(r) for r in response_ids), dtype=np.int64, count=B)
    N_B = P_B + L_B
    T = int(N_B.max())
    col_T = np.arange(T)
    attn_BT = col_T < N_B[:, None]  # prompt + response
    resp_BT = attn_BT & (col_T >= P_B[:, None])  # response only
    # row-major order of the True cells of attn_BT is prompt_0, response_0, prompt_1, ...
    pieces = [piece for p, r in zip(prompt_ids, response_ids) for piece in (p, r)]
    ids_BT = np.zeros((B, T), dtype=np.int64)
    ids_BT[attn_BT] = np.concatenate(pieces).astype(np.int64, copy=False) if pieces else []
    response_BT = resp_BT.astype(np.float32)
    if loss_mask is not None and B:
        response_BT[resp_BT] = np.concatenate([np.asarray(m, dtype=np.float32).reshape(-1) for m in loss_mask])
    batch = TokenBatch(
        input_ids=torch.from_numpy(ids_BT),
        attention_mask=torch.from_numpy(attn_BT.astype(np.int64)),
        response_mask=torch.from_numpy(response_BT),
    )
    for name, col in (per_token or {}).items():
        extra_BT = np.zeros((B, T), dtype=np.float32)
        extra_BT[resp_BT] = np.concatenate([np.asarray(c, dtype=np.float32).reshape(-1) for c in col]) if B else []
        setattr(batch, name, torch.from_numpy(extra_BT))
    return batch, P_B.tolist()
