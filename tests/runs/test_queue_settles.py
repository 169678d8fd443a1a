"""The end of a run: the workers' last acks become notices inside the queue (acks to
the manager, frees to the shards and controllers); the driver delivers them before
the queue's processes stop (``Launcher._settle_queue``), so none is sent to an actor
that already stopped (which waited out its 10 s timeout and held the stop that long)."""

from __future__ import annotations

from pathlib import Path

import pytest
from wf_helpers import afctl, read_jsonl

LOCAL = Path(__file__).resolve().parents[2] / "examples" / "local.toml"


@pytest.mark.timeout(200)
def test_no_notice_of_the_queue_is_lost_or_waited_out_when_a_run_ends(tmp_path):
    run_dir = tmp_path / "run"
    # the shipped example (its step size is what left rows to free at the stop), short and not warm-started
    sets = ["train.num_steps=20", "model.tiny_warm_start_steps=0", "eval.every_steps=0"]
    proc = afctl("up", str(LOCAL), "--run-dir", str(run_dir), *[a for s in sets for a in ("--set", s)])
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert len(read_jsonl(run_dir / "metrics.jsonl")) == 20
    for host in ("queue", "shard.0"):
        log = (run_dir / "logs" / f"{host}.log").read_text()
        assert "could not tell" not in log, log
    assert "could not tell" not in out, out
