"""Shared prompts in training (``train.engine.share_prompts``): the samples of a group
share one prompt, so the trainer's forward runs each distinct prompt of a micro-batch
once and every row's response on top of that prompt's keys and values.

Shape legend: B rows, T their padded length, G distinct prompts, P the longest of
them, R the longest response part (a row's tokens from its first response token to
its last real token), V vocabulary.

A GRPO step of 8 prompts x 8 samples with 50-token prompts and 16-token responses
feeds the decoder 8 x 50 + 64 x 16 = 1,424 tokens instead of 64 x 66 = 4,224.

Invariants:
- The same log-probs (and entropies) as the padded path, up to float rounding: a
  prompt's keys and values are the same in every row that holds it. Each row's
  response part attends to its prompt's real tokens (the prompts' right padding is
  masked) at positions continuing from the prompt's length.
- The same gradients, up to float rounding: the prompt's keys and values are indexed
  out to its rows (``group_B``), and autograd sums the rows' gradients back into the
  one prompt pass, as the padded path sums them over the copies.
- Outputs come back at the rows' ``[b, t]`` with 0 off the response part (column 0,
  never a response token, included).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from asyncflow.engines.base import TokenBatch


@dataclass
class SharedPlan:
    """A micro-batch laid out as distinct prompts plus each row's response part."""

    group_B: torch.Tensor
    """int64 [B]: the distinct prompt row b holds (an index into ``prompt_GP``)."""
    prompt_GP: torch.Tensor
    """int64 [G, P]: the distinct prompts, right-padded (with each one's last token)."""
    prompt_mask_GP: torch.Tensor
    """int64 [G, P]: 1 on real prompt tokens."""
    prompt_len_B: torch.Tensor
    """int64 [B]: row b's prompt length (its first response position)."""
    response_BR: torch.Tensor
    """int64 [B, R]: row b's tokens from its first response token on, right-padded."""
    response_mask_BR: torch.Tensor
    """int64 [B, R]: 1 on those real tokens."""
    length: int
    """T: the padded batch's length, that outputs are put back at."""

    def to(self, device: torch.device | str) -> SharedPlan:
        moved: dict[str, Any] = {k: v.to(device) for k, v in self.__dict__.items() if isinstance(v, torch.Tensor)}
        return dataclasses.replace(self, **moved)

    def back(self, values_BR: torch.Tensor) -> torch.Tensor:
        """Per-token values of the response parts [B, R] at their ``[b, t]`` in [B, T], 0
        elsewhere; differentiable in ``values_BR``."""
        B, R = values_BR.shape
        pos_BR = self.prompt_len_B[:, None] + torch.arange(R, device=values_BR.device)
        pos_BR = torch.where(self.response_mask_BR > 0, pos_BR, self.length)  # padding: one spare column, dropped
        out = torch.zeros(B, self.length + 1, dtype=values_BR.dtype, device=values_BR.device)
        return out.scatter(1, pos_BR, values_BR * (self.response_mask_BR > 0))[:, : self.length]


def plan_shared(batch: TokenBatch) -> SharedPlan | None:
    """The plan of a right-padded micro-batch, or None where sharing does not apply or
    saves nothing: rows not right-padded (a mask with holes), a row without a response
    token or without a prompt token before it, or every prompt distinct."""
    mask_BT = batch.attention_mask
    has_BT = batch.response_mask > 0
    if mask_BT.shape[1] >= 2 and not bool((mask_BT[:, 1:] <= mask_BT[:, :-1]).all()):
        return None
    if not bool(has_BT.any(dim=1).all()):
        return None
    first_B = has_BT.float().argmax(dim=1)
    if int(first_B.min()) < 1:
        return None
    length_B = mask_BT.sum(dim=1)
    ids_BT = batch.input_ids
    groups: dict[tuple[int, ...], int] = {}
    group = [groups.setdefault(tuple(ids_BT[b, : int(first_B[b])].tolist()), len(groups)) for b in range(len(ids_BT))]
    if len(groups) == len(ids_BT):
        return None
    prompts = [list(p) for p in groups]
    P = max(len(p) for p in prompts)
    prompt_GP = torch.stack([torch.tensor(p + [p[-1]] * (P - len(p)), dtype=torch.int64) for p in prompts])
    prompt_mask_GP = torch.tensor([[1] * len(p) + [0] * (P - len(p)) for p in prompts], dtype=torch.int64)
    span_B = length_B - first_B
    R = int(span_B.max())
    offs_R = torch.arange(R)
    cols_BR = (first_B[:, None] + offs_R).clamp(max=ids_BT.shape[1] - 1)
    response_mask_BR = (offs_R[None, :] < span_B[:, None]).to(torch.int64)
    response_BR = ids_BT.gather(1, cols_BR) * response_mask_BR
    return SharedPlan(
        group_B=torch.tensor(group, dtype=torch.int64),
        prompt_GP=prompt_GP,
        prompt_mask_GP=prompt_mask_GP,
        prompt_len_B=first_B.to(torch.int64),
        response_BR=response_BR,
        response_mask_BR=response_mask_BR,
        length=ids_BT.shape[1],
    )


def shared_hidden(model: torch.nn.Module, plan: SharedPlan) -> torch.Tensor:
    """The decoder's (``lm.model``'s) hidden states [B, R, E] that predict each row's
    response-part tokens: its prompt's last position, then its own positions but the last."""
    prompt_out = model(input_ids=plan.prompt_GP, use_cache=True)  # right-padded: causal attention alone
    cache = prompt_out.past_key_values
    cache.batch_select_indices(plan.group_B)  # each row's copy of its prompt's keys and values
    B, R = plan.response_BR.shape
    mask_BS = torch.cat([plan.prompt_mask_GP[plan.group_B], plan.response_mask_BR], dim=1)
    positions_BR = plan.prompt_len_B[:, None] + torch.arange(R, device=plan.response_BR.device)
    out = model(
        input_ids=plan.response_BR,
        attention_mask=mask_BS,
        position_ids=positions_BR,
        use_cache=True,
        **{cache_keyword(model): cache},
    )
    last_BE = prompt_out.last_hidden_state[plan.group_B, plan.prompt_len_B - 1]
    return torch.cat([last_BE[:, None], out.last_hidden_state[:, :-1]], dim=1)


def cache_keyword(model: torch.nn.Module) -> str:
    """The name the decoder takes its key/value cache by: ``cache`` from transformers 5.25
    on (``past_key_values`` is deprecated there), ``past_key_values`` before."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
