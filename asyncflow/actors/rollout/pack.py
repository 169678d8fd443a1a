"""A rollout row's columns, packed in one place: the unit, stream (partial) and multi-turn
modes all pack their rows here. The columns and their dtypes are the table of
``config/columns.py``, which the gateway's sessions use too: ``row()`` is that table's
builder (it refuses a column not in it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from asyncflow.config.columns import row
from asyncflow.core.protocol import RowMeta


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
