"""``reward.placement = "rollout"``: the rollout replica scores its own rows and puts
``reward`` with the responses; no reward process runs (docs/performance.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from wf_helpers import afctl, assert_trained_exactly_once, read_jsonl, write_config

HERE = Path(__file__).resolve().parent


@pytest.mark.timeout(240)
# the sync case is -m slow (the default suite stays under 10 minutes); async runs by default
@pytest.mark.parametrize("mode,staleness", [pytest.param("sync", 0, marks=pytest.mark.slow), ("async", 1)])
def test_rewards_scored_in_the_rollout_reach_the_trainer_row_by_row_and_no_reward_process_runs(tmp_path, mode, staleness):
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path,
        mode=mode,
        num_steps=4,
        staleness=staleness,
        extra=f'[cluster]\npython_path = ["{HERE}"]\n',
        changes={"reward": {"functions": ["wf_rewards:stop_and_aligned"], "placement": "rollout"}},
    )
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=220)
    assert proc.returncode == 0, out
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [int(m["step"]) for m in metrics] == [0, 1, 2, 3]
    # every row scored with its own prompt, answer and finish reason (wf_rewards.stop_and_aligned)
    for m in metrics:
        assert m["reward_mean"] == pytest.approx(2.0 - m["truncated_frac"]), m
    assert_trained_exactly_once(run_dir, 4, 2, 2)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert not [role for role in summary["busy_s"] if role.startswith("reward")], summary["busy_s"]
    trace = json.loads((run_dir / "trace.json").read_text())
    hosts = {e["args"]["name"].split()[0] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert "rollout.0" in hosts and not any(h.startswith("reward") for h in hosts), hosts
    scored = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "score"]
    assert scored, "the rollout recorded no score activity"
