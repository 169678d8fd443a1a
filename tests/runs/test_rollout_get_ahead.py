"""A whole run whose every weight fetch is slow: rows are trained by the weights
that generated them. The order itself (rows of a newly announced version asked for
while its weights travel, generated only once they are swapped in) is forced with
events in tests/actors/test_weight_inbox.py; this run read it off the trace's wall
clock, which a loaded machine reorders legitimately (a fetch that ends before the
unit starts is swapped in before the unit's get)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from wf_helpers import afctl, assert_trained_exactly_once, read_jsonl, write_config

HERE = Path(__file__).parent
FAULTS = HERE / "faults"


@pytest.mark.slow  # 20 s: -m slow (suite time); the order is tested in isolation (tests/actors/test_weight_inbox.py)
@pytest.mark.timeout(200)
def test_with_slow_weight_fetches_every_row_is_trained_by_the_weights_that_generated_it(tmp_path):
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, mode="sync", num_steps=4, staleness=0)
    env_path = os.pathsep.join(filter(None, [str(FAULTS), str(HERE), os.environ.get("PYTHONPATH", "")]))
    # every fetch takes 0.3 s longer (faults/sitecustomize.py): each swap waits for a fetch in flight
    proc = afctl(
        "up", str(config), "--run-dir", str(run_dir), env_extra={"AF_TEST_ROLLOUT_FAULT": "slow_fetch", "PYTHONPATH": env_path}
    )
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    # sync: every row trained by the weights that generated it, each checked by its digest
    assert all(m["staleness_max"] == 0 and m["weights_mismatch"] == 0 for m in metrics), metrics
    assert_trained_exactly_once(run_dir, 4, 2, 2)
