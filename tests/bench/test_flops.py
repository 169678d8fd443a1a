"""bench/flops.py: the matmul peak measured on the spot, and training's share of it."""

from __future__ import annotations

import pytest

from asyncflow.bench import flops

pytestmark = pytest.mark.timeout(60)


def test_the_peak_is_a_real_matmul_rate_in_each_dtype():
    small = 256  # fast here; the benchmark uses MATMUL_SIZE
    for dtype in ("float32", "bfloat16"):
        rate = flops.matmul_peak(dtype, size=small, seconds=0.05)
        # at least one matmul a second, and no faster than 1 PFLOP/s on this CPU
        assert 2 * small**3 <= rate < 1e15, (dtype, rate)


def test_training_flops_are_six_per_parameter_and_token_against_the_peak():
    assert flops.train_flops(135_000_000, 1000) == 6 * 135e9
    achieved, share = flops.of_peak(100, 50, 2.0, peak=1e5)
    assert achieved == 6 * 100 * 50 / 2.0 and share == pytest.approx(achieved / 1e5)
