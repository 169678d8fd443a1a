"""Two trainer ranks (``train.num_ranks = 2``, FSDP2 over gloo) in the real workflow:
each rank trains whole prompt groups it reads itself; losing a rank stops the run
cleanly, and the run resumes from its checkpoint with both ranks."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import safetensors.torch
import torch

from wf_helpers import afctl, assert_trained_exactly_once, child_hosts, read_jsonl, wait_for_steps, write_config

HERE = Path(__file__).parent

DATA_PARALLEL = f"""
[cluster]
python_path = ["{HERE}"]
"""


def _config(tmp_path: Path, num_steps: int) -> Path:
    return write_config(tmp_path, num_steps=num_steps, checkpoint_every=2, extra=DATA_PARALLEL, changes={
        "reward": {"functions": ["wf_rewards:length"]},
        "train": {"num_ranks": 2},
        "train.engine": {"fsdp": True},
    })


@pytest.mark.timeout(300)
def test_two_trainer_ranks_train_their_own_groups_a_lost_rank_stops_the_run_and_it_resumes(tmp_path):
    run_dir = tmp_path / "run"
    num_steps = 24
    first = afctl("up", str(_config(tmp_path, num_steps)), "--run-dir", str(run_dir))
    wait_for_steps(run_dir, first, 3, 200)  # the checkpoint of version 2 is written
    hosts = child_hosts(first.pid)
    assert {"trainer", "trainer.1"} <= set(hosts), hosts
    os.kill(hosts["trainer.1"], signal.SIGKILL)
    out, _ = first.communicate(timeout=120)
    assert first.returncode != 0, out
    assert "trainer.1" in out and f"afctl up --resume {run_dir}" in out, out
    for pid in hosts.values():  # nothing is left behind
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], pid

    second = afctl("up", "--resume", str(run_dir))
    out, _ = second.communicate(timeout=200)
    assert second.returncode == 0, out
    assert_trained_exactly_once(run_dir, num_steps, 2, 2)
    for line in read_jsonl(run_dir / "trained.jsonl"):
        # one whole prompt group per rank per step
        assert sorted(line["ranks"]) == [0, 0, 1, 1], line
        by_rank = {r: {g for g, rr in zip(line["groups"], line["ranks"]) if rr == r} for r in (0, 1)}
        assert len(by_rank[0]) == len(by_rank[1]) == 1 and not by_rank[0] & by_rank[1], line
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert all(m["num_ranks"] == 2 and m["samples"] == 4 for m in metrics)
    assert any(m["loss"] != 0.0 for m in metrics)  # the length reward gives real gradients
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["busy_s"]["trainer.1"] > 0
    final = Path(summary["checkpoint"]) / "model" / "model.safetensors"
    start = run_dir / "model" / "model.safetensors"
    trained, initial = safetensors.torch.load_file(final), safetensors.torch.load_file(start)
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[k], initial[k]) for k in trained)
