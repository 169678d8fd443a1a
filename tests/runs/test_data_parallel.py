"""Two trainer ranks (``train.num_ranks = 2``, FSDP2 over gloo) in the real workflow:
each rank trains whole prompt groups it reads itself; losing a rank stops the run
cleanly, and it resumes itself from its checkpoint with both ranks
(``cluster.max_resumes``)."""

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
max_resumes = 1
"""


def _config(tmp_path: Path, num_steps: int, **changes: dict) -> Path:
    return write_config(
        tmp_path,
        num_steps=num_steps,
        checkpoint_every=2,
        extra=DATA_PARALLEL,
        changes={
            "reward": {"functions": ["wf_rewards:length"]},
            "train": {"num_ranks": 2},
            "train.engine": {"fsdp": True},
            **changes,
        },
    )


@pytest.mark.slow  # 45 s: keeps the default suite under 10 minutes on 2 cores
@pytest.mark.timeout(300)
def test_two_trainer_ranks_train_their_own_groups_and_a_lost_rank_is_healed_by_a_resume(tmp_path):
    run_dir = tmp_path / "run"
    num_steps = 24
    proc = afctl("up", str(_config(tmp_path, num_steps)), "--run-dir", str(run_dir))
    wait_for_steps(run_dir, proc, 3, 200)  # the checkpoint of version 2 is written
    hosts = child_hosts(proc.pid)
    assert {"trainer", "trainer.1"} <= set(hosts), hosts
    os.kill(hosts["trainer.1"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=250)
    assert proc.returncode == 0, out
    # the run stopped every process, then resumed itself from its checkpoint ([cluster] max_resumes = 1)
    assert "process 'trainer.1' (trainer_rank) exited with code -9" in out and "automatic resume 1 of 1" in out, out
    for pid in hosts.values():  # the first launch's processes are gone
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], pid
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
    assert len(summary["resumes"]) == 1 and "trainer.1" in summary["resumes"][0]["error"]
    final = Path(summary["checkpoint"]) / "model" / "model.safetensors"
    start = run_dir / "model" / "model.safetensors"
    trained, initial = safetensors.torch.load_file(final), safetensors.torch.load_file(start)
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[k], initial[k]) for k in trained)


@pytest.mark.timeout(200)
def test_ppo_with_a_kl_reference_trains_its_critic_on_both_ranks_too(tmp_path):
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path,
        num_steps=3,
        changes={
            "reward": {"functions": ["wf_rewards:length"]},
            "algorithm": {"name": "ppo", "kl_coef": 0.01},
            "train": {"num_ranks": 2},
            "train.engine": {"fsdp": True},
            "critic.engine": {"fsdp": True},
        },
        extra=f'[cluster]\npython_path = ["{HERE}"]\n',
    )
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [int(m["step"]) for m in metrics] == [0, 1, 2]
    assert all(m["num_ranks"] == 2 and "critic_loss" in m and "kl" in m for m in metrics)
    final = Path(json.loads((run_dir / "summary.json").read_text())["checkpoint"])
    assert (final / "critic" / "value_head.safetensors").exists() and (final / "model" / "model.safetensors").exists()


@pytest.mark.slow  # about 60 s
@pytest.mark.timeout(300)
def test_two_ranks_train_the_decoupled_loss_with_an_adaptive_kl_and_keep_one_coefficient(tmp_path):
    """Each row's policy version reaches both ranks (``TrainPart.versions``: the decoupled
    loss's interpolation), and the adaptive KL coefficient, measured over both ranks' rows
    (an all-reduce), is one value that rank 0 alone writes into each checkpoint."""
    run_dir = tmp_path / "run"
    changes = {
        "algorithm": {"clip_against": "proximal", "kl_coef": 0.01},
        "algorithm.loss": {"name": "decoupled_ppo"},
        "algorithm.kl_ctrl": {"type": "adaptive"},
    }
    config = _config(tmp_path, 4, **changes)
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=250)
    assert proc.returncode == 0, out
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    coefs = [m["kl_coef"] for m in metrics]
    assert coefs[0] == pytest.approx(0.01) and coefs[-1] != coefs[0], coefs  # it moves
    assert any(m["staleness_max"] >= 1 for m in metrics) and all(m["num_ranks"] == 2 for m in metrics)
    saved = json.loads((run_dir / "checkpoints" / "step_000004" / "kl_ctrl.json").read_text())
    assert saved["kl_coef"] != coefs[0], saved
