"""A rollout replica asks for the rows of a newly announced version while that
version's weights are still being fetched, and generates them only once they are
swapped in (actors/rollout.py, ``_swap_to``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from wf_helpers import afctl, assert_trained_exactly_once, read_jsonl, write_config

HERE = Path(__file__).parent
FAULTS = HERE / "faults"


@pytest.mark.timeout(200)
def test_rows_are_asked_for_while_the_weights_travel_and_generated_after_the_swap(tmp_path):
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, mode="sync", num_steps=4, staleness=0)
    env_path = os.pathsep.join(filter(None, [str(FAULTS), str(HERE), os.environ.get("PYTHONPATH", "")]))
    # every fetch takes 0.3 s longer (faults/sitecustomize.py): long enough that the order shows
    proc = afctl(
        "up", str(config), "--run-dir", str(run_dir), env_extra={"AF_TEST_ROLLOUT_FAULT": "slow_fetch", "PYTHONPATH": env_path}
    )
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    # sync: every row trained by the weights that generated it, each checked by its digest
    assert all(m["staleness_max"] == 0 and m["weights_mismatch"] == 0 for m in metrics), metrics
    assert_trained_exactly_once(run_dir, 4, 2, 2)
    trace = json.loads((run_dir / "trace.json").read_text())
    pid = next(
        e["pid"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e.get("name") == "process_name" and e["args"]["name"].startswith("rollout.0")
    )
    spans = sorted(
        (e["ts"], e["name"]) for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid and e.get("cat") != "phase"
    )
    units = []  # per generate call after a swap: (start of the get that took its rows, start of its swap)
    last_get = last_swap = None
    for ts, name in spans:
        if name == "get":
            last_get = ts
        elif name == "swap_weights":
            last_swap = ts
        elif name == "generate" and last_swap is not None:
            units.append((last_get, last_swap))
            last_swap = None
    assert len(units) == 3, spans  # steps 1..3 each generated after swapping in the version announced
    assert all(get < swap for get, swap in units), units
