"""``[cluster] pin_trainer_cores``: which cores each process gets (async only), the
refusals naming the key, and a real async run whose trainer ran on its own core."""

from __future__ import annotations

import os

import msgspec
import pytest

from asyncflow.actors.supervisor import pinned_cores
from asyncflow.config.run import ConfigError, load_config
from asyncflow.core.host import CPUS_ENV

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "local.toml")


def _cfg(pin: int, mode: str = "async"):
    cfg = load_config(EXAMPLE)
    return msgspec.structs.replace(
        cfg,
        cluster=msgspec.structs.replace(cfg.cluster, pin_trainer_cores=pin),
        workflow=msgspec.structs.replace(cfg.workflow, mode=mode),
    )


@pytest.mark.timeout(30)
def test_the_trainer_gets_the_first_cores_and_every_other_process_the_rest(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5, 7})
    training, other = True, False  # a process of the training group (trainer and its ranks), or any other
    assert pinned_cores(_cfg(1), training) == {CPUS_ENV: "3"}
    assert pinned_cores(_cfg(1), other) == {CPUS_ENV: "5,7"} and pinned_cores(_cfg(2), other) == {CPUS_ENV: "7"}
    assert pinned_cores(_cfg(0), training) == {} and pinned_cores(_cfg(1, mode="sync"), training) == {}
    with pytest.raises(ConfigError, match="cluster.pin_trainer_cores = 3.*at most 2"):
        pinned_cores(_cfg(3), training)


@pytest.mark.timeout(30)
def test_pinning_with_the_ray_launcher_is_refused_by_name(tmp_path):
    text = open(EXAMPLE).read().replace("[cluster]", '[cluster]\nlauncher = "ray"')
    text = text.replace("pin_trainer_cores = 0", "pin_trainer_cores = 1")
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="cluster.pin_trainer_cores"):
        load_config(str(path))


@pytest.mark.slow  # 23 s: a whole async run
@pytest.mark.timeout(120)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_in_a_real_async_run_the_trainer_runs_on_its_own_core(tmp_path):
    import json
    import subprocess
    import sys
    import time

    from tiny_config import write_tiny_config

    cores = sorted(os.sched_getaffinity(0))
    path = write_tiny_config(
        tmp_path / "c.toml",
        {
            "train": {"num_steps": 30, "checkpoint_every": 0},
            "workflow": {"mode": "async"},
            "logging": {"progress": False},
            "cluster": {"pin_trainer_cores": 1},
        },
    )
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncflow.cli.main", "up", str(path), "--run-dir", str(run_dir)],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        allowed = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(allowed) < 2:
            if (run_dir / "metrics.jsonl").exists() and (run_dir / "cluster.json").exists():
                hosts = json.loads((run_dir / "cluster.json").read_text())["hosts"]
                for name in ("trainer", "rollout.0"):
                    status = open(f"/proc/{hosts[name]}/status").read()
                    line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list"))
                    allowed[name] = line.split(":", 1)[1].strip()
            assert proc.poll() is None or allowed, proc.stdout.read()
            time.sleep(0.2)
        assert allowed["trainer"] == str(cores[0])
        assert str(cores[0]) not in allowed["rollout.0"].replace("-", ",").split(",")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
