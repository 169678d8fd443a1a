"""The twin's smoke run (examples/twin-smoke.toml): 64 emulated rollout replicas packed 16
to a process, an emulated trainer, async; the real control plane end to end. Every row's
weights digest is its version's (``verify_weights = "error"``) and every planned group is
trained exactly once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from wf_helpers import afctl, assert_trained_exactly_once, read_jsonl

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "twin-smoke.toml"


@pytest.mark.timeout(240)
def test_sixty_four_emulated_replicas_in_four_processes_train_every_step_exactly_once(tmp_path):
    run_dir = tmp_path / "run"
    proc = afctl("up", str(EXAMPLE), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=220)
    assert proc.returncode == 0, out
    started = re.search(r"starting (\d+) processes: (.*)", out)
    assert started is not None, out
    hosts = started.group(2).split(", ")
    assert [h for h in hosts if h.startswith("rollout")] == [f"rollout.pack.{k}" for k in range(4)]
    assert int(started.group(1)) == len(hosts) == 8  # queue, shard, loader, 4 packs, trainer
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert len(metrics) == 3 and all(m["weights_mismatch"] == 0 for m in metrics), metrics
    assert_trained_exactly_once(run_dir, 3, 64, 2)
    busy = json.loads((run_dir / "summary.json").read_text())["busy_s"]  # every worker's stats, by actor
    assert sorted(name for name in busy if name.startswith("rollout.")) == sorted(f"rollout.{i}" for i in range(64))
