"""Overlong shaping (DAPO, arXiv 2503.14476): a soft length penalty over the last
tokens before ``max_new_tokens``, and dropping truncated responses from the loss.

Shape legend: B sequences, T tokens. L_b: response length of row b in tokens (the
stop token counts, as in ``max_new_tokens``); M: ``max_new_tokens``; W: the buffer.

    penalty_b = 0                                  L_b <= M - W
              = -penalty * (L_b - (M - W)) / W     M - W < L_b <= M
              = -penalty                           L_b > M (cannot happen; clamped)

Invariants:
- The penalty is 0 at L = M - W, -penalty at L = M, linear in between, never below
  -penalty; W = 0 is no shaping (all zeros).
- It is added to the reward before any advantage is computed, so GRPO's group
  statistics see the shaped reward of every sample of a group.
- A dropped row has no token left in ``response_mask``. The engine takes a step's
  loss denominators from that mask (``LossContext``: the sum of the mask, the rows
  with a token), so the token mean runs over the remaining tokens only and the
  sequence mean over the remaining rows: the other rows' loss is what it would be
  without the dropped ones in the batch, and the dropped rows get no gradient.
"""

from __future__ import annotations

import numpy as np
import torch


def overlong_penalty(lengths_B: torch.Tensor, max_new_tokens: int, buffer: int, penalty: float) -> torch.Tensor:
    """The term (<= 0) added to each row's reward for its length; zeros with ``buffer = 0``."""
    if buffer == 0:
        return torch.zeros(lengths_B.shape, dtype=torch.float32)
    over_B = (lengths_B.float() - (max_new_tokens - buffer)).clamp(min=0.0, max=float(buffer))
    return -penalty * over_B / buffer


def truncated_rows(finish: list[np.ndarray]) -> torch.Tensor:
    """bool [B]: the rows cut at ``max_new_tokens`` (the queue's ``finish`` column is 0:
    finish reason "length"; 1 is "stop")."""
    return torch.tensor([int(f[0]) == 0 for f in finish], dtype=torch.bool)


def drop_rows(mask_BT: torch.Tensor, drop_B: torch.Tensor) -> torch.Tensor:
    """``mask_BT`` with every token of the rows in ``drop_B`` (bool [B]) set to 0."""
    return mask_BT * (~drop_B).to(mask_BT.dtype).unsqueeze(1)
