"""Ragged rollout samples -> a right-padded ``TokenBatch`` for training, and the
sequence packer: a batch's rows laid end to end in rows of a token budget.

Shape legend: B samples, T = longest prompt + response; R packed rows, N tokens per
packed row (at most the budget).

Invariants:
- Row b is ``prompt_b + response_b`` then padding; ``response_mask`` is 1 exactly on
  the response tokens, so log-probs, advantages and losses line up with the rollout
  engine's per-token outputs (``logp_BT[b, len(prompt_b) + i] = logprobs_b[i]``).
- Per-sequence scalars (advantages) are broadcast over the response tokens.
- Packing (``plan_packing``, ``pack_rows``): every real token of every sequence is
  placed exactly once, a sequence never spans two packed rows, no packed row holds
  more than the budget (the budget is at least the longest sequence), and position
  ids restart at 0 with each sequence. A packed row's tail after its last sequence
  is padding whose positions also restart at 0, so it is a sequence of its own that
  no real token attends to. ``PackedRows.unpack`` puts per-token outputs back at
  their ``[b, t]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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


def plan_packing(
    lengths: Sequence[int], budget: int, rows_per_micro_batch: int, min_micro_batches: int = 1
) -> list[list[list[int]]]:
    """Which sequences go in which packed row of which micro-batch:
    ``plan[m][r]`` lists the indices (into ``lengths``) packed, in that order, in row
    r of micro-batch m. First-fit decreasing into rows of at most ``max(budget,
    longest)`` tokens, then at most ``rows_per_micro_batch`` rows per micro-batch, in
    as few micro-batches as that allows but at least ``min_micro_batches`` (rows with
    several sequences are split to get there; FSDP ranks need the same count).
    Sequences of length 0 are left out."""
    if rows_per_micro_batch < 1:
        raise ValueError(f"rows_per_micro_batch must be at least 1, not {rows_per_micro_batch}")
    live = [i for i, n in enumerate(lengths) if n > 0]
    if len(live) < min_micro_batches:
        raise ValueError(
            f"{len(live)} non-empty sequences cannot fill {min_micro_batches} micro-batches; give every "
            "data-parallel rank the same number of rows per step"
        )
    if not live:
        return []
    budget = max(budget, max(lengths[i] for i in live))
    rows: list[list[int]] = []
    fill: list[int] = []
    for i in sorted(live, key=lambda i: (-lengths[i], i)):
        for r, used in enumerate(fill):
            if used + lengths[i] <= budget:
                rows[r].append(i)
                fill[r] += lengths[i]
                break
        else:
            rows.append([i])
            fill.append(lengths[i])
    num_mbs = max(math.ceil(len(rows) / rows_per_micro_batch), min_micro_batches)
    while len(rows) < num_mbs:  # split the row with most sequences in two
        r = max(range(len(rows)), key=lambda r: len(rows[r]))
        half = len(rows[r]) // 2
        rows.append(rows[r][half:])
        rows[r] = rows[r][:half]
    # rows are in decreasing fill: deal them out in contiguous runs of near-equal size
    size, extra = divmod(len(rows), num_mbs)
    plan, start = [], 0
    for m in range(num_mbs):
        stop = start + size + (1 if m < extra else 0)
        plan.append(rows[start:stop])
        start = stop
    return plan


@dataclass(frozen=True)
class PackedRows:
    """Sequences of a ``[B, T]`` right-padded batch packed into ``[R, N]`` rows, with
    the index maps to put per-token outputs back."""

    input_ids: torch.Tensor
    """int64 [R, N]: sequences end to end, then padding (id 0)."""
    position_ids: torch.Tensor
    """int64 [R, N]: 0, 1, ... restarting with every sequence (and with the padding)."""
    src: torch.Tensor
    """int64 [num real tokens]: flat index ``b * T + t`` of each real token in the batch."""
    dst: torch.Tensor
    """int64 [num real tokens]: flat index ``r * N + n`` of the same token when packed."""
    batch_shape: tuple[int, int]
    """(B, T) of the batch it was packed from."""

    def to(self, device: torch.device | str) -> PackedRows:
        return PackedRows(
            input_ids=self.input_ids.to(device),
            position_ids=self.position_ids.to(device),
            src=self.src.to(device),
            dst=self.dst.to(device),
            batch_shape=self.batch_shape,
        )

    def unpack(self, x_RN: torch.Tensor) -> torch.Tensor:
        """Per-token values ``[R, N]`` -> ``[B, T]`` at the batch's real tokens (0 elsewhere)."""
        out_BT = x_RN.new_zeros(self.batch_shape)
        out_BT.view(-1)[self.src] = x_RN.reshape(-1)[self.dst]
        return out_BT


def sequence_ids(position_ids_RN: torch.Tensor) -> torch.Tensor:
    """Which sequence of its row each packed token belongs to: a new one wherever the
    position does not go up by one (what ``transformers.masking_utils`` detects)."""
    first = position_ids_RN[:, :1] - 1
    return (torch.diff(position_ids_RN, prepend=first, dim=-1) != 1).cumsum(-1)


def block_causal_mask(position_ids_RN: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The explicit 4-D additive mask ``[R, 1, N, N]`` for packed rows: a token sees
    the earlier tokens of its own sequence (0) and nothing else (dtype's minimum)."""
    seq_RN = sequence_ids(position_ids_RN)
    N = position_ids_RN.shape[1]
    causal_NN = torch.ones(N, N, dtype=torch.bool, device=position_ids_RN.device).tril()
    allowed_RNN = (seq_RN.unsqueeze(2) == seq_RN.unsqueeze(1)) & causal_NN
    mask = torch.zeros(allowed_RNN.shape, dtype=dtype, device=position_ids_RN.device)
    return mask.masked_fill_(~allowed_RNN, torch.finfo(dtype).min).unsqueeze(1)


def pack_rows(lengths_B: torch.Tensor, width_T: int, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions and flat index maps of a packing: ``rows[r]`` lists the batch rows
    (right-padded, ``lengths_B`` real tokens each, ``width_T`` wide) laid end to end in
    packed row r. Returns (position_ids [R, N], (src, dst) stacked [2, num tokens])
    with N the fullest row's length."""
    lengths = lengths_B.tolist()
    N = max(sum(lengths[b] for b in row) for row in rows)
    pos_RN = torch.empty(len(rows), N, dtype=torch.long)
    src, dst = [], []
    for r, row in enumerate(rows):
        n = 0
        for b in row:
            k = lengths[b]
            pos_RN[r, n : n + k] = torch.arange(k)
            src.append(torch.arange(k) + b * width_T)
            dst.append(torch.arange(k) + (r * N + n))
            n += k
        pos_RN[r, n:] = torch.arange(N - n)
    return pos_RN, torch.stack([torch.cat(src), torch.cat(dst)])


def pack_batch(batch: TokenBatch, rows: Sequence[Sequence[int]]) -> PackedRows:
    """``batch``'s rows packed as ``rows`` says (``plan_packing``'s rows of one
    micro-batch, as indices into ``batch``). The batch must be right-padded."""
    B, T = batch.input_ids.shape
    lengths_B = batch.attention_mask.sum(dim=1)
    pos_RN, (src, dst) = pack_rows(lengths_B, T, rows)
    ids_RN = torch.zeros(pos_RN.shape, dtype=batch.input_ids.dtype)
    ids_RN.view(-1)[dst] = batch.input_ids.reshape(-1)[src]
    return PackedRows(input_ids=ids_RN, position_ids=pos_RN, src=src, dst=dst, batch_shape=(B, T))
