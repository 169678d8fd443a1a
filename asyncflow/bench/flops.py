"""How close training comes to the machine's arithmetic peak: the peak measured on the
spot by a square matmul of the training's dtype, with the threads the training has, and
the training's achieved FLOP/s counted the usual way (6 x parameters x tokens a step:
forward 2, backward 4; attention's own FLOPs are left out, as the usual count does).

Used by ``afctl bench train`` (each configuration's ``of peak`` figure).
"""

from __future__ import annotations

import time

MATMUL_SIZE = 2048
"""The side of the square matmul the peak is measured with (large enough to be bound by
arithmetic, not memory, on a CPU or an accelerator)."""


def matmul_peak(dtype: str, device: str = "cpu", size: int = MATMUL_SIZE, seconds: float = 1.0) -> float:
    """FLOP/s of ``size`` x ``size`` matmuls in ``dtype`` ("float32", "bfloat16", "float16")
    on ``device`` with the current torch threads: the best of repeated timed rounds after a
    warm-up, each round 2 x size^3 FLOP a matmul."""
    import torch

    kind = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=g).to(device=device, dtype=kind)
    b = torch.randn(size, size, generator=g).to(device=device, dtype=kind)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    torch.matmul(a, b)  # warm-up: kernels chosen, caches filled
    sync()
    best = float("inf")
    deadline = time.perf_counter() + seconds
    rounds = 0
    while rounds < 3 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        torch.matmul(a, b)
        sync()
        best = min(best, time.perf_counter() - t0)
        rounds += 1
    return 2.0 * size**3 / best


def train_flops(num_params: int, tokens: int) -> float:
    """FLOP of training on ``tokens`` tokens: 6 per parameter and token."""
    return 6.0 * num_params * tokens


def of_peak(num_params: int, tokens: int, seconds: float, peak: float) -> tuple[float, float]:
    """(achieved FLOP/s, its fraction of ``peak``) of ``tokens`` trained in ``seconds``."""
    achieved = train_flops(num_params, tokens) / seconds
    return achieved, achieved / peak
