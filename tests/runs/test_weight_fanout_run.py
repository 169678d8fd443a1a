"""A whole run whose weight versions reach the replicas through the relay tree
(``[workflow] weight_fanout = "tree"``): real rollout replicas, each with its relay; the
trainer checks every row's digest (``verify_weights = "error"``: a row generated with
weights other than its version's fails the step)."""

from __future__ import annotations

import json

import pytest
from wf_helpers import afctl, assert_trained_exactly_once, read_jsonl, write_config


@pytest.mark.slow  # a whole run, about 30 s (the relay itself is tested in tests/actors/test_weight_fanout.py)
@pytest.mark.timeout(240)
def test_a_run_whose_replicas_relay_the_weights_in_a_chain_trains_every_step_with_verified_rows(tmp_path):
    run_dir = tmp_path / "run"
    changes = {
        "rollout": {"num_replicas": 3},
        "workflow": {"weight_fanout": "tree", "weight_fanout_degree": 1, "verify_weights": "error"},
    }
    config = write_config(tmp_path, mode="async", num_steps=5, staleness=1, changes=changes)
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=220)
    assert proc.returncode == 0, out
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert len(metrics) == 5 and all(m["weights_mismatch"] == 0 for m in metrics), metrics
    assert_trained_exactly_once(run_dir, 5, 2, 2)
    counters = json.loads((run_dir / "summary.json").read_text())["counters"]
    # a chain: rollout.0 pulls from the trainer, rollout.1 from rollout.0, rollout.2 from rollout.1
    assert counters["rollout.0"]["weights/bytes_relayed"] == 0 < counters["rollout.0"]["weights/bytes_from_root"]
    for child in ("rollout.1", "rollout.2"):
        assert counters[child]["weights/bytes_relayed"] > 0, counters[child]
    assert counters["rollout.0"]["weights/relay_bytes_served"] > 0
