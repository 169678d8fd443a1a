"""Devices: cpu, cuda, npu; their torch.distributed backends and memory queries.

Invariants:
- ``torch_npu`` is imported only when an npu device is asked for, so cpu and cuda
  installs never need it.
- One table maps a device kind to its distributed backend: cpu -> gloo,
  cuda -> nccl, npu -> hccl.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import torch

BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_device(kind: str, index: int = 0) -> torch.device:
    """The torch.device for ``kind`` ('cpu', 'cuda', 'npu'), checking it exists."""
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' asked for but torch sees no CUDA GPU; set device = \"cpu\"")
        return torch.device("cuda", index)
    if kind == "npu":
        _import_torch_npu()
        if not torch.npu.is_available():  # type: ignore[attr-defined]
            raise RuntimeError("device 'npu' asked for but torch_npu sees no Ascend NPU; set device = \"cpu\"")
        return torch.device("npu", index)
    raise ValueError(f"unknown device {kind!r}; use 'cpu', 'cuda' or 'npu'")


def _import_torch_npu() -> None:
    if importlib.util.find_spec("torch_npu") is None:
        raise RuntimeError("device 'npu' needs torch_npu: pip install -e '.[npu]' (in the asyncflow checkout) on an Ascend host")
    importlib.import_module("torch_npu")


def dist_backend(kind: str) -> str:
    """torch.distributed backend for a device kind."""
    if kind not in BACKENDS:
        raise ValueError(f"unknown device {kind!r}; use one of {sorted(BACKENDS)}")
    if kind == "npu":
        _import_torch_npu()
    return BACKENDS[kind]


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(DTYPES)}")
    return DTYPES[name]


def free_memory_bytes(device: torch.device) -> int:
    """Free memory on an accelerator (for fraction-of-memory budgets)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "npu":
        return int(torch.npu.mem_get_info(device)[0])  # type: ignore[attr-defined]
    raise ValueError("a memory fraction needs an accelerator; on cpu give kv_cache_bytes instead")


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels (timing)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        torch.npu.synchronize(device)  # type: ignore[attr-defined]


def set_cpu_threads(num_threads: int | None) -> None:
    """Set torch intra-op threads (None: leave as is)."""
    if num_threads is not None:
        torch.set_num_threads(num_threads)


def init_process_group(device_kind: str, rank: int, world_size: int, master_addr: str, master_port: int) -> None:
    """Initialise the default process group with the device's backend (env:// style)."""
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    torch.distributed.init_process_group(backend=dist_backend(device_kind), rank=rank, world_size=world_size)
    if device_kind == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    elif device_kind == "npu":
        torch.npu.set_device(rank % torch.npu.device_count())  # type: ignore[attr-defined]
