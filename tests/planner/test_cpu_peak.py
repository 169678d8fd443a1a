"""This host's CPU peak (``planner.cpu_peak``, read by ``planner.io.local_cpu_peak``) and the preflight's step-time estimate that
uses it: an AVX-512 core with bfloat16 dot products is 2x an AVX2 core's fp32 lanes and 2x
again for a trainer under ``train.engine.autocast``; the static profile made the estimate
of SmolLM2's step 148 s where a step took 16 s."""

from __future__ import annotations

import json

import pytest
from real_configs import write_smollm2_config

from asyncflow.planner import cpu_peak, io
from asyncflow.planner.cpu_peak import CpuPeak, parse_cpuinfo

ZEN5 = """processor\t: 0
model name\t: AMD EPYC
cpu MHz\t\t: 2596.122
flags\t\t: fpu sse sse2 fma avx avx2 avx512f avx512dq avx512_bf16 avx512vl
processor\t: 1
cpu MHz\t\t: 1200.000
flags\t\t: fpu sse sse2
"""
AVX2 = "cpu MHz\t\t: 2450.000\nflags\t\t: fpu sse fma avx avx2\n"
NO_CLOCK = "flags\t\t: fpu sse sse2\n"


@pytest.mark.timeout(10)
def test_an_avx512_core_with_bf16_dot_products_doubles_its_fp32_peak_for_bfloat16():
    peak = parse_cpuinfo(ZEN5)  # the first processor's lines only
    assert peak.fp32_flops == pytest.approx(2 * 16 * 2 * 2.596122e9)
    assert peak.bf16_flops == pytest.approx(2 * peak.fp32_flops)
    assert "avx512" in peak.describe and "avx512_bf16" in peak.describe and "2.60 GHz" in peak.describe


@pytest.mark.timeout(10)
def test_an_avx2_core_has_half_the_lanes_and_a_slower_emulated_bfloat16():
    peak = parse_cpuinfo(AVX2)
    assert peak.fp32_flops == pytest.approx(2 * 8 * 2 * 2.45e9)  # 78 GFLOP/s: the static cpu profile's figure
    assert peak.bf16_flops == pytest.approx(peak.fp32_flops * cpu_peak.EMULATED_BF16)
    assert peak.bf16_flops < peak.fp32_flops
    assert "no bfloat16 instructions" in peak.describe


@pytest.mark.timeout(10)
def test_a_cpuinfo_without_a_clock_assumes_one_and_says_so():
    peak = parse_cpuinfo(NO_CLOCK)
    assert peak.fp32_flops == pytest.approx(2 * 4 * 2 * cpu_peak.DEFAULT_GHZ * 1e9)
    assert "assumed" in peak.describe


@pytest.mark.timeout(10)
def test_an_unreadable_cpuinfo_gives_no_peak(tmp_path):
    assert io.local_cpu_peak(str(tmp_path / "absent")) is None


@pytest.mark.timeout(60)
def test_the_step_estimate_reads_this_cpu_and_halves_training_under_bfloat16_autocast(tmp_path, monkeypatch):
    from asyncflow.actors.driver.preflight import step_estimate
    from asyncflow.config.load import load_config_text

    model_dir = write_smollm2_config(tmp_path / "m")
    monkeypatch.setattr(io, "local_cpu_peak", lambda path="/proc/cpuinfo": parse_cpuinfo(ZEN5))
    head = f"[model]\npath = {json.dumps(str(model_dir))}\n[cluster]\nthreads_per_process = 1\n"
    fp32 = step_estimate(load_config_text(head), str(model_dir), prompt_tokens=46.0)
    mixed = step_estimate(load_config_text(head + '[train.engine]\nautocast = "bfloat16"\n'), str(model_dir), 46.0)
    assert "avx512_bf16" in fp32.line and "bfloat16 training" in mixed.line
    assert "166 GFLOP/s / 166 GFLOP/s peak" in fp32.line and "332 GFLOP/s / 166 GFLOP/s peak" in mixed.line
    assert mixed.seconds < fp32.seconds
    # the estimate scales with the peak: the static profile's 78 GFLOP/s per core (an AVX2 core) on the same config
    static = CpuPeak(fp32_flops=78e9, bf16_flops=78e9, describe="the static profile")
    monkeypatch.setattr(io, "local_cpu_peak", lambda path="/proc/cpuinfo": static)
    slow = step_estimate(load_config_text(head), str(model_dir), 46.0)
    assert slow.seconds == pytest.approx(fp32.seconds * parse_cpuinfo(ZEN5).fp32_flops / 78e9)
