"""Rows of a transformers KV cache, for the hf rollout engine (``hf_rollout.py``): how
sequences of one model can share a cache, and the surgery that lets them.

A cache's ``layout`` says what its layers allow:
- ``padded``: every layer is a plain ``DynamicLayer`` (keys and values ``[B, H, T, D]``,
  grown by concatenation) and the model takes ``attention_mask`` and ``position_ids``:
  sequences of any lengths share one cache, left-padded with zeros that the attention
  mask hides (``left_pad``, ``concat``, ``crop_left``), rows repeated or dropped by
  ``Cache.batch_select_indices``;
- ``cohorts``: layers that repeat and drop rows but must not be padded (a sliding
  window keeps the last tokens of every row alike): only the samples of one prompt,
  admitted together and so always of one length, share a cache;
- ``single``: anything else (linear attention or state space layers): one sequence a cache.

Invariant (padded): row ``i`` of a cache of width ``W`` holds its sequence's ``W - pad_i``
tokens in columns ``pad_i .. W - 1``; the columns before are zeros, never attended.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin

Layout = Literal["padded", "cohorts", "single"]


def layout(cache: Any, takes_mask_and_positions: bool) -> Layout:
    """What rows of this cache (a model's own, after a forward) allow (module docstring)."""
    layers: list[Any] = getattr(cache, "layers", None) or []
    if not layers or any(
        not isinstance(layer, DynamicLayer) or isinstance(layer, LinearAttentionCacheLayerMixin) for layer in layers
    ):
        return "single"
    if takes_mask_and_positions and all(type(layer) is DynamicLayer for layer in layers):
        return "padded"
    return "cohorts"


def _tensor_bytes(obj: Any, depth: int = 0) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if depth > 3:
        return 0
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, depth + 1) for v in obj)
    return 0


def cache_bytes(cache: Any) -> int:
    """Bytes of the tensors a cache holds (each layer's tensors, dicts and lists of them)."""
    layers = getattr(cache, "layers", None)
    if layers is None:  # a legacy tuple of (key, value) per layer
        return _tensor_bytes(cache)
    return sum(_tensor_bytes(vars(layer)) for layer in layers)


def _filled(cache: Any) -> list[Any]:
    """The layers holding keys (a layer whose KV another shares is never filled)."""
    return [layer for layer in cache.layers if layer.is_initialized and layer.keys is not None and layer.keys.numel()]


def width(cache: Any) -> int:
    """Columns (token positions) of a padded cache; 0 for an empty one."""
    return int(cache.get_seq_length())


def left_pad(cache: Any, n: int) -> None:
    """``n`` zero columns before every row's tokens, in every layer."""
    if n > 0:
        for layer in _filled(cache):
            layer.keys = F.pad(layer.keys, (0, 0, n, 0))
            layer.values = F.pad(layer.values, (0, 0, n, 0))


def crop_left(cache: Any, n: int) -> None:
    """Drop the first ``n`` columns (padding every row has)."""
    if n > 0:
        for layer in _filled(cache):
            layer.keys = layer.keys[:, :, n:]
            layer.values = layer.values[:, :, n:]


def concat(into: Any, rows: Any) -> None:
    """Append the rows of ``rows`` (a cache of the same width) to ``into``."""
    for mine, theirs in zip(_filled(into), _filled(rows), strict=True):
        mine.keys = torch.cat([mine.keys, theirs.keys])
        mine.values = torch.cat([mine.values, theirs.values])


def merge(into: Any, pads: list[int], rows: Any, row_pads: list[int]) -> list[int]:
    """Rows of ``rows`` appended to ``into`` (both padded caches), the narrower one
    left-padded to the wider; returns the pads of every row of ``into`` after."""
    a, b = width(into), width(rows)
    if a < b:
        left_pad(into, b - a)
        pads = [p + b - a for p in pads]
    elif b < a:
        left_pad(rows, a - b)
        row_pads = [p + a - b for p in row_pads]
    concat(into, rows)
    return pads + row_pads
