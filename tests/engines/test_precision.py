"""``train.engine.autocast = "auto"`` (engines/precision.py): bfloat16 where the trainer's
host runs it natively, float32 where torch would emulate it; and the preflight's
warning when bfloat16 is asked for by name on a CPU that emulates it. On an AVX2 EPYC
without bf16 instructions examples/smollm2.toml's first step (bfloat16 autocast) took
more than 430 s where its estimate said 147 s."""

from __future__ import annotations

import json

import pytest
import torch
from real_configs import write_smollm2_config

from asyncflow.engines.config import TrainEngineConfig
from asyncflow.engines.factory import build_train_engine
from asyncflow.engines.precision import bf16_fast, resolve_autocast
from asyncflow.planner import io
from asyncflow.planner.cpu_peak import EMULATED_BF16, parse_cpuinfo

AVX2 = "cpu MHz\t\t: 2450.000\nflags\t\t: fpu sse fma avx avx2\n"
AVX512_BF16 = "cpu MHz\t\t: 2596.122\nflags\t\t: fpu sse fma avx avx2 avx512f avx512_bf16\n"
AMX = "cpu MHz\t\t: 2000.000\nflags\t\t: fpu sse fma avx avx2 avx512f amx_bf16 amx_tile\n"


def on_cpu(monkeypatch, cpuinfo: str) -> None:
    """This host's /proc/cpuinfo as ``cpuinfo`` says, for the engine's reading and the planner's."""
    from asyncflow.engines import precision

    monkeypatch.setattr(io, "local_cpu_peak", lambda path="/proc/cpuinfo": parse_cpuinfo(cpuinfo))
    flags = next((line.partition(":")[2].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    monkeypatch.setattr(precision, "cpu_bf16_isa", lambda path="": next((f for f in precision.BF16_FLAGS if f in flags), ""))


@pytest.mark.timeout(10)
def test_bfloat16_is_native_only_with_avx512_bf16_or_amx_and_emulated_bfloat16_is_slower_than_float32():
    for native in (AVX512_BF16, AMX):
        assert parse_cpuinfo(native).bf16_flops > parse_cpuinfo(native).fp32_flops
    emulated = parse_cpuinfo(AVX2)
    assert emulated.bf16_flops == pytest.approx(emulated.fp32_flops * EMULATED_BF16) and EMULATED_BF16 < 1


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("cpuinfo", "expected"), [(AVX2, "off"), (AVX512_BF16, "bfloat16"), (AMX, "bfloat16")])
def test_auto_resolves_by_this_hosts_cpu_and_named_settings_stay_as_they_are(monkeypatch, cpuinfo, expected):
    on_cpu(monkeypatch, cpuinfo)
    assert bf16_fast("cpu") == (expected == "bfloat16")
    assert resolve_autocast("auto", "cpu") == expected
    assert resolve_autocast("bfloat16", "cpu") == "bfloat16"  # asked for by name: the preflight warns, it still runs
    assert resolve_autocast("off", "cpu") == "off"


@pytest.mark.timeout(10)
def test_auto_without_a_readable_cpuinfo_is_float32(tmp_path):
    from asyncflow.engines.precision import cpu_bf16_isa

    assert cpu_bf16_isa(str(tmp_path / "absent")) == ""
    (tmp_path / "cpuinfo").write_text(AVX512_BF16)
    assert cpu_bf16_isa(str(tmp_path / "cpuinfo")) == "avx512_bf16"
    (tmp_path / "cpuinfo").write_text(AVX2)
    assert cpu_bf16_isa(str(tmp_path / "cpuinfo")) == ""


@pytest.mark.timeout(10)
def test_an_unknown_setting_names_the_key_and_the_choices():
    with pytest.raises(ValueError, match="train.engine.autocast.*'auto'"):
        resolve_autocast("float16", "cpu")


@pytest.mark.timeout(10)
def test_auto_is_a_config_value_and_still_needs_float32_master_weights():
    from asyncflow.core.schema import Refused

    TrainEngineConfig(autocast="auto").check(None)
    with pytest.raises(Refused, match="autocast"):
        TrainEngineConfig(dtype="bfloat16", autocast="auto").check(None)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("cpuinfo", "dtype"), [(AVX2, torch.float32), (AVX512_BF16, torch.bfloat16)])
def test_the_trainer_under_auto_computes_in_what_the_host_runs_natively(monkeypatch, qwen2_dir, cpuinfo, dtype):
    on_cpu(monkeypatch, cpuinfo)
    trainer = build_train_engine(TrainEngineConfig(micro_batch_size=2, autocast="auto"), qwen2_dir)
    assert trainer.compute_dtype == dtype
    seen: list[torch.dtype] = []
    layer = trainer.net.lm.model.layers[0].mlp.down_proj
    hook = layer.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    from asyncflow.engines.base import TokenBatch

    mask = torch.tensor([[0, 0, 0, 1, 1, 1]], dtype=torch.float32)
    trainer.forward(TokenBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=mask))
    hook.remove()
    assert seen and set(seen) == {dtype}


def _estimate(tmp_path, monkeypatch, cpuinfo: str, extra: str):
    from asyncflow.actors.driver.preflight import step_estimate
    from asyncflow.config.load import load_config_text

    on_cpu(monkeypatch, cpuinfo)
    model_dir = write_smollm2_config(tmp_path / "m")
    head = f"[model]\npath = {json.dumps(str(model_dir))}\n[cluster]\nthreads_per_process = 1\n"
    return step_estimate(load_config_text(head + extra), str(model_dir), prompt_tokens=46.0)


@pytest.mark.timeout(60)
def test_the_preflight_warns_of_emulated_bfloat16_by_key_and_fix_and_charges_it(tmp_path, monkeypatch):
    asked = _estimate(
        tmp_path, monkeypatch, AVX2, '[train.engine]\nautocast = "bfloat16"\n[rollout.engine]\ndtype = "bfloat16"\n'
    )
    assert 'train.engine.autocast = "bfloat16" and rollout.engine.dtype = "bfloat16"' in asked.line
    assert "no bfloat16 instructions" in asked.line and '"auto"' in asked.line
    fp32 = _estimate(tmp_path, monkeypatch, AVX2, "")
    assert "warning" not in fp32.line
    assert asked.seconds > fp32.seconds  # emulated bfloat16 is charged as slower, not as fast as float32
    auto = _estimate(tmp_path, monkeypatch, AVX2, '[train.engine]\nautocast = "auto"\n')
    assert "warning" not in auto.line and auto.seconds == pytest.approx(fp32.seconds)
    assert 'train.engine.autocast = "auto": float32' in auto.line  # the preflight says what auto took
    # where the CPU has the instructions, nothing to warn of, and auto is charged as bfloat16
    native = _estimate(tmp_path, monkeypatch, AVX512_BF16, '[train.engine]\nautocast = "bfloat16"\n')
    native_auto = _estimate(tmp_path, monkeypatch, AVX512_BF16, '[train.engine]\nautocast = "auto"\n')
    assert "warning" not in native.line and native_auto.seconds == pytest.approx(native.seconds)
    assert 'train.engine.autocast = "auto": bfloat16' in native_auto.line
