"""A reward function that goes bad mid-run stops the run before anything trains on it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from wf_helpers import afctl, read_jsonl, write_config

HERE = Path(__file__).resolve().parent


@pytest.mark.timeout(240)
# scored in the rollout replica: -m slow (the default suite stays under 10 minutes)
@pytest.mark.parametrize("placement", ["role", pytest.param("rollout", marks=pytest.mark.slow)])
def test_a_nan_reward_stops_the_run_naming_the_function_and_nothing_trains_on_it(tmp_path, placement):
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path,
        num_steps=12,
        extra=f'[cluster]\npython_path = ["{HERE}"]\n',
        changes={"reward": {"functions": ["wf_rewards:nan_from_the_third_call"], "placement": placement}},
    )
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=220)
    assert proc.returncode != 0, out
    assert "wf_rewards:nan_from_the_third_call returned nan for sample" in out and "(row " in out, out
    metrics = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    assert len(metrics) < 12
    assert all(math.isfinite(m["loss"]) for m in metrics), [m["loss"] for m in metrics]
