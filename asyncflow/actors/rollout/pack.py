"""The output columns of a rollout row, with their dtypes in one place: the unit,
stream (partial) and multi-turn modes all pack their rows here.

- ``response_ids`` int64 [T]: the tokens after the prompt;
- ``rollout_logp`` float32 [T]: the generating policy's log-prob of each (0 on
  environment tokens of a multi-turn row);
- ``finish`` uint8 [1]: 1 when a stop token (or the environment) ended the row;
- ``token_versions`` int32 [T] (partial rollout): the version that sampled each token;
- ``loss_mask`` uint8 [T], ``env_reward`` float32 [1], ``env_error`` uint8 [1],
  ``env_tool_calls`` int32 [1] (multi-turn, docs/environments.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from asyncflow.core.protocol import RowMeta

DTYPES: dict[str, Any] = {
    "response_ids": np.int64,
    "rollout_logp": np.float32,
    "finish": np.uint8,
    "token_versions": np.int32,
    "loss_mask": np.uint8,
    "env_reward": np.float32,
    "env_error": np.uint8,
    "env_tool_calls": np.int32,
}
SCALARS = ("finish", "env_reward", "env_error", "env_tool_calls")
"""Columns of one value per row (shape [1])."""


def row(**values: Any) -> dict[str, np.ndarray]:
    """One row's columns, each in its dtype (a scalar column from a plain value)."""
    unknown = values.keys() - DTYPES.keys()
    if unknown:
        raise KeyError(f"no rollout column {sorted(unknown)}; the columns are {sorted(DTYPES)}")
    return {name: np.asarray([v] if name in SCALARS else v, dtype=DTYPES[name]) for name, v in values.items()}


def completion_row(c: Any, token_versions: bool = False) -> dict[str, np.ndarray]:
    """The row of one ``Completion`` (``engines/base.py``)."""
    out = row(response_ids=c.response_ids, rollout_logp=c.logprobs, finish=c.finish_reason == "stop")
    if token_versions:
        out.update(row(token_versions=c.token_versions))
    return out


def columns(rows: Sequence[dict[str, np.ndarray]]) -> dict[str, list[np.ndarray]]:
    """Rows to the column lists ``TQClient.put`` takes (every row has the same columns)."""
    return {name: [r[name] for r in rows] for name in rows[0]} if rows else {}


def stamped(meta: RowMeta, version: int, response_len: int, digest: int) -> RowMeta:
    """A row's metadata with the version and weights digest that generated it."""
    return msgspec.structs.replace(meta, version=version, response_len=response_len, weights_digest=digest)
