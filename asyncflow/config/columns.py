"""The columns the rollout writes into the queue, with one dtype each, in one table: the
rollout's modes (``actors/rollout/pack.py``: unit, stream, multi-turn) and the gateway's
sessions (``gateway/feed.py``) build their rows with ``row()``, so a column the trainer
reads has the same dtype whoever wrote it. It sits in the config layer, beside the task
names of ``names.py``: both writers may import it (the gateway imports no actor), and core
knows no RL. Torch-free: numpy only.

- ``prompt_ids`` int64 [P] (gateway sessions): the context before the first model token;
- ``response_ids`` int64 [T]: the tokens after the prompt;
- ``rollout_logp`` float32 [T]: the generating policy's log-prob of each (0 on context or
  environment tokens);
- ``finish`` uint8 [1]: 1 when a stop token (or the environment) ended the row;
- ``token_versions`` int32 [T] (partial rollout, sessions): the version that sampled each token;
- ``loss_mask`` uint8 [T] (multi-turn, sessions): 1 on the model's tokens;
- ``reward`` float32 [1] (sessions): the reward the client sent;
- ``env_reward`` float32 [1], ``env_error`` uint8 [1], ``env_tool_calls`` int32 [1]
  (multi-turn, docs/environments.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

DTYPES: dict[str, Any] = {
    "prompt_ids": np.int64,
    "response_ids": np.int64,
    "rollout_logp": np.float32,
    "finish": np.uint8,
    "token_versions": np.int32,
    "loss_mask": np.uint8,
    "reward": np.float32,
    "env_reward": np.float32,
    "env_error": np.uint8,
    "env_tool_calls": np.int32,
}
SCALARS = ("finish", "reward", "env_reward", "env_error", "env_tool_calls")
"""Columns of one value per row (shape [1])."""


def row(**values: Any) -> dict[str, np.ndarray]:
    """One row's columns, each in its dtype (a scalar column from a plain value)."""
    unknown = values.keys() - DTYPES.keys()
    if unknown:
        raise KeyError(f"no rollout column {sorted(unknown)}; the columns are {sorted(DTYPES)}")
    return {name: np.asarray([v] if name in SCALARS else v, dtype=DTYPES[name]) for name, v in values.items()}
