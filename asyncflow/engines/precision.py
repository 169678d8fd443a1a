"""Whether bfloat16 pays on this host: ``train.engine.autocast = "auto"`` resolves here.

bfloat16 matmuls are fast where the hardware has them: a GPU of compute capability 8.0
or newer, an Ascend NPU, or an x86 CPU with ``avx512_bf16`` or ``amx_bf16``. On a CPU
without those instructions torch emulates them, and SmolLM2-135M trained several
times slower than in float32 (docs/real-model.md, 'Training at real size'), so
``"auto"`` is mixed precision where it pays and float32 where it does not. The host
that decides is the one the engine runs on (a trainer on another machine reads its
own /proc/cpuinfo). What the preflight says of it: ``actors/driver/preflight.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

Autocast = Literal["off", "bfloat16"]
CPUINFO = "/proc/cpuinfo"
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""The /proc/cpuinfo flags of a CPU that runs bfloat16 dot products natively."""


def cpu_bf16_isa(path: str = CPUINFO) -> str:
    """The bfloat16 instruction set this host's CPU names in ``path`` ("" where it names
    none, or the file cannot be read: not Linux)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags = set(value.split())
            return next((f for f in BF16_FLAGS if f in flags), "")
    return ""


def bf16_fast(device_kind: str) -> bool:
    """Whether ``device_kind`` ("cpu", "cuda", "npu") on this host runs bfloat16 matmuls
    natively (faster than float32), not emulated."""
    if device_kind == "cuda":
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device_kind == "npu":
        return True
    return bool(cpu_bf16_isa())


def resolve_autocast(setting: str, device_kind: str) -> Autocast:
    """``train.engine.autocast`` as the engine applies it on this host: ``"auto"`` is
    ``"bfloat16"`` where :func:`bf16_fast`, else ``"off"``; the others as they are."""
    if setting == "auto":
        return "bfloat16" if bf16_fast(device_kind) else "off"
    if setting not in ("off", "bfloat16"):
        raise ValueError(f"train.engine.autocast = {setting!r}: use 'off', 'bfloat16' or 'auto'")
    return "bfloat16" if setting == "bfloat16" else "off"
