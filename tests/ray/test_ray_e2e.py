"""The tiny end-to-end run with ``[cluster] launcher = "ray"`` on a local Ray cluster:
every process host is a Ray actor's child, registered over tcp on the node's IP with
the cluster secret. Marked ``ray`` (not in the default run): see conftest.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "runs"))
from wf_helpers import assert_trained_exactly_once, read_jsonl, write_config  # noqa: E402

RAY_CLUSTER = """
[cluster]
launcher = "ray"
[cluster.transport]
scheme = "tcp"
bind_host = "0.0.0.0"
"""


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_tiny_run_with_hosts_placed_by_ray_trains_every_step_exactly_once(tmp_path, ray_env):
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, mode="async", num_steps=3, staleness=1, extra=RAY_CLUSTER)
    env = dict(os.environ, OMP_NUM_THREADS="1", ASYNCFLOW_SECRET="ray-test-secret", **ray_env)
    done = subprocess.run(
        [sys.executable, "-m", "asyncflow.cli.main", "up", str(config), "--run-dir", str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "done: 3 steps" in out
    for host in ("queue", "shard.0", "loader", "rollout.0", "reward.0", "trainer"):
        assert f"ray: process {host} on node " in out, out[-6000:]
    assert [int(m["step"]) for m in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1, 2]
    assert_trained_exactly_once(run_dir, 3, 2, 2)
    cluster = json.loads((run_dir / "cluster.json").read_text())
    assert cluster["directory"].startswith("tcp://") and cluster["transport"]["secret"] == ""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == []


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_two_trainer_ranks_placed_by_ray_rendezvous_through_the_directory_and_train(tmp_path, ray_env):
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path,
        mode="async",
        num_steps=3,
        staleness=1,
        extra=RAY_CLUSTER,
        changes={"train": {"num_ranks": 2}, "train.engine": {"fsdp": True}},
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", ASYNCFLOW_SECRET="ray-test-secret", **ray_env)
    done = subprocess.run(
        [sys.executable, "-m", "asyncflow.cli.main", "up", str(config), "--run-dir", str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "ray: process trainer.1 on node " in out, out[-6000:]
    assert_trained_exactly_once(run_dir, 3, 2, 2)
    assert all(sorted(rec["ranks"]) == [0, 0, 1, 1] for rec in read_jsonl(run_dir / "trained.jsonl"))


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_killed_rollout_host_under_ray_is_placed_again_and_every_sample_is_trained_exactly_once(tmp_path, ray_env):
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, mode="async", num_steps=4, staleness=1, extra=RAY_CLUSTER)
    env = dict(os.environ, OMP_NUM_THREADS="1", ASYNCFLOW_SECRET="ray-test-secret", **ray_env)
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncflow.cli.main", "up", str(config), "--run-dir", str(run_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines, rollout_pid, killed = [], None, False
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("ray: process rollout.0 on node ") and rollout_pid is None:
            rollout_pid = int(line.split("(pid ")[1].split(",")[0])  # a local Ray cluster: the pid is on this machine
        if line.startswith("step ") and not killed:
            os.kill(rollout_pid, signal.SIGKILL)
            killed = True
    out = "".join(lines)
    assert proc.wait(timeout=60) == 0, out[-6000:]
    assert killed and out.count("ray: process rollout.0 on node ") == 2, out[-6000:]
    assert "rollout.0 exited with code -9: requeued" in out
    assert_trained_exactly_once(run_dir, 4, 2, 2)
    restarts = json.loads((run_dir / "summary.json").read_text())["restarts"]
    assert [r["host"] for r in restarts] == ["rollout.0"]


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_frozen_rollout_host_under_ray_is_reported_lost_by_the_heartbeat_and_placed_again(tmp_path, ray_env):
    """SIGSTOP: the process neither exits nor answers, as a node that hangs or is cut off."""
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, mode="async", num_steps=4, staleness=1, extra=RAY_CLUSTER)
    env = dict(os.environ, OMP_NUM_THREADS="1", ASYNCFLOW_SECRET="ray-test-secret", **ray_env)
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncflow.cli.main", "up", str(config), "--run-dir", str(run_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines, frozen_pid, frozen_at, reported_after_s = [], None, None, None
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("ray: process rollout.0 on node ") and frozen_pid is None:
                frozen_pid = int(line.split("(pid ")[1].split(",")[0])
            if line.startswith("step ") and frozen_at is None:
                os.kill(frozen_pid, signal.SIGSTOP)
                frozen_at = time.monotonic()
            if "host 'rollout.0'" in line and "has not answered Ping" in line and reported_after_s is None:
                reported_after_s = time.monotonic() - frozen_at
        out = "".join(lines)
        assert proc.wait(timeout=60) == 0, out[-6000:]
    finally:
        if frozen_pid is not None:  # Ray's kill reached its parent; SIGKILL works on a stopped process
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen_pid, signal.SIGKILL)
    assert reported_after_s is not None and reported_after_s < 15, out[-6000:]
    print(f"\nthe frozen host was reported lost {reported_after_s:.1f} s after SIGSTOP")
    assert out.count("ray: process rollout.0 on node ") == 2
    assert_trained_exactly_once(run_dir, 4, 2, 2)
    restarts = json.loads((run_dir / "summary.json").read_text())["restarts"]
    assert [r["host"] for r in restarts] == ["rollout.0"]


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_ctrl_c_under_ray_stops_every_host_and_says_how_to_resume(tmp_path, ray_env):
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, mode="async", num_steps=50, staleness=1, extra=RAY_CLUSTER)
    env = dict(os.environ, OMP_NUM_THREADS="1", ASYNCFLOW_SECRET="ray-test-secret", **ray_env)
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncflow.cli.main", "up", str(config), "--run-dir", str(run_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    pids = []
    for line in proc.stdout:
        if line.startswith("ray: process "):
            pids.append(int(line.split("(pid ")[1].split(",")[0]))
        if line.startswith("step "):
            proc.send_signal(signal.SIGINT)
            break
    out = proc.stdout.read()
    assert proc.wait(timeout=120) == 130, out[-6000:]
    assert f"afctl up --resume {run_dir}" in out
    assert len(pids) == 6

    def running(pid: int) -> bool:
        with contextlib.suppress(FileNotFoundError):
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        return False

    deadline = time.monotonic() + 30
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(running(p) for p in pids)
