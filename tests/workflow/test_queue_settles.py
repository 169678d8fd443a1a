"""The end of a run: the workers' last acks become notices inside the queue (acks to
the manager, frees to the shards and controllers); the driver delivers them before
the queue's processes stop (``Launcher._settle_queue``), so none is sent to an actor
that already stopped (which would wait out its 10 s timeout and hold the stop)."""

from __future__ import annotations

import pytest
from wf_helpers import afctl, read_jsonl, write_config


@pytest.mark.timeout(200)
@pytest.mark.parametrize("placement", ["role", "rollout"])
def test_no_notice_of_the_queue_is_lost_or_waited_out_when_a_run_ends(tmp_path, placement):
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, num_steps=4, changes={"reward": {"placement": placement}})
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert len(read_jsonl(run_dir / "metrics.jsonl")) == 4
    for host in ("queue", "shard.0"):
        log = (run_dir / "logs" / f"{host}.log").read_text()
        assert "could not tell" not in log, log
    assert "could not tell" not in out, out
