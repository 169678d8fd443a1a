"""Weights digests: a 63-bit fingerprint of one policy version's weights.

The trainer stamps every version it publishes with the digest of its snapshot; a
rollout replica stamps every row it generates with the digest of the weights it
generated with; the trainer checks the two agree for the version the row is tagged
with (``workflow.verify_weights``). A replica that generates with weights other than
its tag names, loads a version only in part, or swaps in the middle of a unit is
caught at the next step, whatever the transport.

The digest hashes each tensor's name, shape and a fixed strided sample of at most
``SAMPLES`` of its elements, so it costs the same for a 0.5 M or a 70 B model (one
gather per tensor). Any optimizer step changes essentially every element, so two
versions never share a sample. Elements are first cast to the rollout engine's
dtype, then to float32: a float32 trainer and a bfloat16 replica of the same
version agree (both round the same way), two versions do not.

The sampled positions are ``i * (numel - 1) // (SAMPLES - 1)``, in int64: exact at
any size (float index arithmetic rounds past 2^24 elements).

Invariant: ``weights_digest`` depends only on the (name, tensor) pairs, not on
their order, device, or memory layout; it is never 0 (0 means "unknown" on rows).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch

SAMPLES = 1024
"""Elements sampled per tensor (all of them for smaller tensors)."""


def sample_index(numel: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """The flat positions a tensor of ``numel`` elements is sampled at (None: all)."""
    if numel <= SAMPLES:
        return None
    # integer arithmetic: float32 (linspace's default) cannot hold numel - 1 past 2^24 elements,
    # which every real embedding passes, and rounded the last position out of bounds
    return torch.arange(SAMPLES, dtype=torch.int64, device=device) * (numel - 1) // (SAMPLES - 1)


def sample(tensor: torch.Tensor) -> torch.Tensor:
    """The elements of ``tensor`` the digest hashes (flat, in its own dtype)."""
    flat = tensor.detach().reshape(-1)
    index = sample_index(flat.numel(), flat.device)
    return flat if index is None else flat[index]


def digest_samples(samples: Iterable[tuple[str, tuple[int, ...], torch.Tensor]], dtype: torch.dtype | None = None) -> int:
    """The digest from each tensor's name, shape and ``sample`` (the samples may be
    computed without the full tensor: a LoRA-merged weight, ``engines/lora.py``)."""
    h = hashlib.blake2b(digest_size=8)
    for name, shape, flat in sorted(samples, key=lambda item: item[0]):
        if dtype is not None and flat.dtype != dtype:
            flat = flat.to(dtype)
        h.update(name.encode())
        h.update(repr(tuple(shape)).encode())
        h.update(flat.to(device="cpu", dtype=torch.float32).numpy().tobytes())
    return (int.from_bytes(h.digest(), "little") >> 1) or 1


def weights_digest(named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None) -> int:
    """The digest of a set of named tensors, elements cast to ``dtype`` first."""
    return digest_samples(((name, tuple(t.shape), sample(t)) for name, t in named_tensors), dtype)
