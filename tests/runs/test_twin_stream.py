"""The emulated engines with partial rollout: a twin-like run (examples/twin-smoke.toml's
engines, fewer replicas) whose replicas generate as emulated streams. Rows span weight swaps
within the staleness bound, every digest is its version's, every planned group is trained
exactly once, and each replica's weight fetches are in the trace (``afctl twin``'s weight time)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from wf_helpers import afctl, assert_trained_exactly_once, read_jsonl

from asyncflow.actors.rollout.inbox import FETCH_SPAN
from asyncflow.bench.twin import weight_time_s
from asyncflow.cli.runs import load_trace

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "twin-smoke.toml"
STEPS = 6


def _config(tmp_path: Path) -> Path:
    text = EXAMPLE.read_text()
    for old, new in (
        ("num_replicas = 64", "num_replicas = 8"),
        ("actors_per_process = 16", "actors_per_process = 4"),
        ("prompts_per_call = 1", "prompts_per_call = 2"),
        ("prompts_per_step = 64", "prompts_per_step = 16"),
        ("num_steps = 3", f"num_steps = {STEPS}"),
        ("max_new_tokens = 16", "max_new_tokens = 32"),
        ("staleness = 1\n", "staleness = 1\npartial_rollout = true\n"),
        ("progress = true", "progress = false"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "twin-stream.toml"
    path.write_text(text)
    return path


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_emulated_streams_train_rows_of_several_versions_each_once_and_trace_their_weight_fetches(tmp_path):
    run_dir = tmp_path / "run"
    proc = afctl("up", str(_config(tmp_path)), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=220)
    assert proc.returncode == 0, out
    assert re.search(r"starting \d+ processes", out), out
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert len(rows) == STEPS
    assert all(r["weights_mismatch"] == 0 and r["staleness_max"] <= 1 and r["token_staleness_max"] <= 1 for r in rows)
    assert max(r["mixed_version_frac"] for r in rows) > 0, rows  # sequences went on across a swap
    assert_trained_exactly_once(run_dir, STEPS, 16, 2)
    trace = load_trace(run_dir / "trace.json")
    fetches = [e for e in trace["traceEvents"] if e.get("name") == FETCH_SPAN]
    assert len({e["pid"] for e in fetches}) == 8  # every replica fetched, each on its own track
    times = weight_time_s(trace)
    assert len(times) >= STEPS - 1 and all(t > 0 for t in times), times
