"""Whether bfloat16 pays on this host: ``train.engine.autocast = "auto"`` resolves here.

bfloat16 matmuls are fast where the hardware has them: a GPU of compute capability 8.0
or newer, an Ascend NPU, or an x86 CPU with ``avx512_bf16`` or ``amx_bf16``. On a CPU
without those instructions torch emulates them, and SmolLM2-135M trained several
times slower than in float32 (docs/real-model.md, 'Training at real size'), so
``"auto"`` is mixed precision where it pays and float32 where it does not. The host
that decides is the one the engine runs on (a trainer on another machine reads its
own /proc/cpuinfo).
"""

from __future__ import annotations

from typing import Literal

from asyncflow.planner import io as planner_io

Autocast = Literal["off", "bfloat16"]


def bf16_fast(device_kind: str) -> bool:
    """Whether ``device_kind`` ("cpu", "cuda", "npu") on this host runs bfloat16 matmuls
    natively (faster than float32), not emulated."""
    if device_kind == "cuda":
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device_kind == "npu":
        return True
    peak = planner_io.local_cpu_peak()
    return peak is not None and peak.bf16_native


def resolve_autocast(setting: str, device_kind: str) -> Autocast:
    """``train.engine.autocast`` as the engine applies it on this host: ``"auto"`` is
    ``"bfloat16"`` where :func:`bf16_fast`, else ``"off"``; the others as they are."""
    if setting == "auto":
        return "bfloat16" if bf16_fast(device_kind) else "off"
    if setting not in ("off", "bfloat16"):
        raise ValueError(f"train.engine.autocast = {setting!r}: use 'off', 'bfloat16' or 'auto'")
    return "bfloat16" if setting == "bfloat16" else "off"


def emulated_bf16_warning(cfg: object) -> str | None:
    """A preflight line where the config asks for bfloat16 by name on a CPU that
    emulates it (``auto`` never does), naming the keys and the fix; None otherwise."""
    from asyncflow.config.run import RunConfig

    assert isinstance(cfg, RunConfig)
    if cfg.cluster.device != "cpu" or bf16_fast("cpu"):
        return None
    keys = []
    if cfg.train.engine.autocast == "bfloat16":
        keys.append('train.engine.autocast = "bfloat16"')
    if cfg.train.engine.dtype == "bfloat16":
        keys.append('train.engine.dtype = "bfloat16"')
    if cfg.rollout.engine.dtype == "bfloat16":
        keys.append('rollout.engine.dtype = "bfloat16"')
    if not keys:
        return None
    peak = planner_io.local_cpu_peak()
    what = peak.describe if peak is not None else "this CPU"
    return (
        f"warning: {' and '.join(keys)} on a CPU without bfloat16 instructions ({what}): torch emulates them, "
        'several times slower than float32 here; set train.engine.autocast = "auto" (bfloat16 only where the CPU '
        'has avx512_bf16 or amx_bf16) or "off", and rollout.engine.dtype = "float32"'
    )


def precision_line(cfg: object) -> str | None:
    """What ``train.engine.autocast = "auto"`` takes on this host, for the preflight
    (the trainer resolves it again on its own host); None for the other settings."""
    from asyncflow.config.run import RunConfig

    assert isinstance(cfg, RunConfig)
    eng = cfg.train.engine
    if eng.autocast != "auto":
        return None
    taken = resolve_autocast("auto", eng.device)
    where = "cpu" if eng.device == "cpu" else eng.device
    if taken == "bfloat16":
        return f'train.engine.autocast = "auto": bfloat16 mixed precision ({where} runs bfloat16 natively)'
    return f'train.engine.autocast = "auto": float32 ({where} has no native bfloat16: emulated, it would be slower)'
