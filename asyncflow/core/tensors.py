"""Tensors on the wire: dtype name + shape + raw bytes (never lists).

``to_wire`` makes no copy of a C-contiguous array (the frame encoder copies once);
``from_wire`` returns a numpy view over the received frame, or a torch tensor. The
view is read-only and keeps the frame alive; copy it if it must outlive the frame
and be written to.
"""

from __future__ import annotations

import numpy as np

from asyncflow.core.protocol import Tensor

# torch dtypes without a numpy twin travel as same-width integers + their name.
_TORCH_ONLY = {"bfloat16": np.int16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}


def to_wire(array) -> Tensor:
    """numpy array or torch tensor (any device) -> wire Tensor."""
    if isinstance(array, np.ndarray):
        arr = np.ascontiguousarray(array)
        return Tensor(dtype=arr.dtype.name, shape=tuple(arr.shape), data=memoryview(arr).cast("B"))  # type: ignore[arg-type]  # ndarray is a buffer; numpy's stubs lack __buffer__
    import torch

    if not isinstance(array, torch.Tensor):
        raise TypeError(f"to_wire takes a numpy array or a torch tensor, not {type(array).__name__}")
    t = array.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    name = str(t.dtype).removeprefix("torch.")
    if name in _TORCH_ONLY:
        raw = t.view(getattr(torch, np.dtype(_TORCH_ONLY[name]).name)).numpy()
    else:
        raw = t.numpy()
    return Tensor(dtype=name, shape=tuple(t.shape), data=memoryview(raw).cast("B") if raw.size else memoryview(b""))  # type: ignore[arg-type]  # as above


def to_numpy(t: Tensor) -> np.ndarray:
    """Wire Tensor -> numpy view (zero copy). bfloat16 comes back as int16 bits."""
    np_dtype = _TORCH_ONLY.get(t.dtype, t.dtype)
    return np.frombuffer(t.data, dtype=np_dtype).reshape(t.shape)


def to_torch(t: Tensor, copy: bool = True):
    """Wire Tensor -> torch tensor. A received frame is read-only, so this copies
    unless the data is a writable buffer and ``copy=False``."""
    import torch

    arr = to_numpy(t)
    if copy or not arr.flags.writeable:  # torch cannot wrap a read-only buffer
        arr = arr.copy()
    out = torch.from_numpy(arr)
    if t.dtype in _TORCH_ONLY:
        out = out.view(getattr(torch, t.dtype))
    return out


def nbytes(t: Tensor) -> int:
    return len(t.data) if isinstance(t.data, (bytes, bytearray)) else t.data.nbytes
