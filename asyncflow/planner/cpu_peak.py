"""A CPU's peak FLOP/s per core, from its /proc/cpuinfo text (read by
``planner.io.local_cpu_peak``), for the preflight's step-time estimate on
``cluster.device = "cpu"``.

The planner's static ``cpu`` profile (``planner.hardware``) describes the AVX2 machine
the project was first measured on; a CPU with AVX-512 has twice its fp32 lanes, and one
with bfloat16 dot products (``avx512_bf16``, or AMX) runs the matmuls of a bfloat16
model (``rollout.engine.dtype``) or of ``train.engine.autocast`` at about twice its fp32
rate again. A wrong peak made the estimate 9x too long for SmolLM2 on an AVX-512 host
(148 s for a 16 s step), and the stall timeout scales with it.

peak per core = FMA units (2) x fp32 lanes (16 with avx512f, 8 with avx2, 4 otherwise)
x 2 FLOP x the clock (``cpu MHz``); bfloat16: x2 with ``avx512_bf16`` or ``amx_bf16``
(AMX is faster still; x2 keeps the estimate on the long side, which is what a stall
timeout wants).
"""

from __future__ import annotations

from msgspec import Struct

FMA_UNITS = 2
DEFAULT_GHZ = 2.5  # a /proc/cpuinfo without "cpu MHz" (some VMs, non-x86)
EMULATED_BF16 = 0.1
"""bfloat16 matmuls without bf16 instructions, as a fraction of the fp32 peak: torch
emulates them. Measured on an AVX2 EPYC at 2.45 GHz, one core, a SmolLM2-135M train step
of 8 x 64 tokens: 58.6 tokens/s in float32, 5.8 under bfloat16 autocast
(``afctl bench train --model models/smollm2-135m --autocast`` prints the ratio)."""


class CpuPeak(Struct, frozen=True):
    fp32_flops: float  # per core
    bf16_flops: float  # per core, matmuls in bfloat16 (emulated without bf16 instructions: EMULATED_BF16 of fp32's)
    describe: str  # what was read, for the preflight's line


def parse_cpuinfo(text: str) -> CpuPeak:
    """The peak of the first processor described in ``text`` (/proc/cpuinfo)."""
    flags: set[str] = set()
    mhz = 0.0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "cpu MHz" and not mhz:
            try:
                mhz = float(value)
            except ValueError:
                pass
    lanes, isa = (16, "avx512") if "avx512f" in flags else (8, "avx2") if "avx2" in flags else (4, "sse")
    ghz = mhz / 1000 if mhz > 0 else DEFAULT_GHZ
    fp32 = FMA_UNITS * lanes * 2 * ghz * 1e9
    bf16_isa = next(
        (f for f in ("amx_bf16", "avx512_bf16") if f in flags), ""
    )  # engines/precision.BF16_FLAGS (planner modules may not import engines)
    bf16 = fp32 * 2 if bf16_isa else fp32 * EMULATED_BF16
    clock = f"{ghz:.2f} GHz" if mhz > 0 else f"{ghz:.2f} GHz assumed"
    describe = f"this CPU: {isa}{', ' + bf16_isa if bf16_isa else ', no bfloat16 instructions'}, {clock}"
    return CpuPeak(fp32_flops=fp32, bf16_flops=bf16, describe=describe)
