"""``afctl twin`` end to end on a small cluster: the planner's split of 8 emulated 910B
devices for 7B runs in sync, async and colocated mode with the real control plane, and
the printed table and JSON carry every figure, each sane: an emulated step > 0, the
overheads finite and small beside the step, the measured throughput within a broad
factor of the planner's prediction, progress shown per step."""

from __future__ import annotations

import json
import math

import pytest
from wf_helpers import afctl

pytestmark = pytest.mark.slow


@pytest.mark.timeout(420)
def test_afctl_twin_runs_three_modes_and_prints_overheads_throughput_and_speedups(tmp_path):
    proc = afctl(
        *("twin", "--model", "7b", "--npus", "8", "--hardware", "910b", "--steps", "4"),
        *("--prompts", "16", "--group", "2", "--out", str(tmp_path / "twin"), "--json"),
    )
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out
    rep = json.loads(out.strip().splitlines()[-1])
    assert set(rep["modes"]) == {"sync", "async", "colocated"}
    for mode, r in rep["modes"].items():
        assert f"[{mode}] step 4/4" in out, out  # progress, one line per step
        assert r["emulated_step_ms"] > 0 and r["measured_step_ms"] > 0, r
        assert set(r["overhead_ms"]) == {"queue", "weights", "directory", "driver"}, r
        for part, ms in r["overhead_ms"].items():
            assert math.isfinite(ms) and ms >= 0, (mode, part, r)
            assert r["overhead_frac"][part] == pytest.approx(ms / r["emulated_step_ms"])
        assert r["overhead_ms"]["queue"] > 0, r  # the queue host worked for every step
        assert 1 / 3 < r["measured_samples_per_s"] / r["predicted_samples_per_s"] < 3, r
        assert r["error"] == pytest.approx(r["measured_samples_per_s"] / r["predicted_samples_per_s"] - 1)
        assert (tmp_path / "twin" / f"{mode}.toml").is_file()  # the config, for afctl up
    assert rep["speedup_async_over_sync"] > 0 and rep["predicted_speedup_async_over_colocated"] > 0
    for label in ("overhead queue, ms/step", "of the emulated step", "predicted samples/s", "measured samples/s", "error"):
        assert label in out, out
    assert "async / sync:" in out and "async / colocated:" in out, out
