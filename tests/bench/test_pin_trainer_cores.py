"""``[cluster] pin_trainer_cores``: which cores each process gets (async only), the
refusals naming the key, and a real async run whose trainer ran on its own core."""

from __future__ import annotations

import os

import msgspec
import pytest

from asyncflow.actors.driver._pinning import cores_busy, pinning
from asyncflow.actors.driver.supervisor import pinned_cores
from asyncflow.config.load import ConfigError, load_config
from asyncflow.core.host import CPUS_ENV

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "local.toml")


def _cfg(pin: int, mode: str = "async", only_when_idle: bool = True):
    cfg = load_config(EXAMPLE)
    return msgspec.structs.replace(
        cfg,
        cluster=msgspec.structs.replace(cfg.cluster, pin_trainer_cores=pin, pin_only_when_idle=only_when_idle),
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
def test_cores_busy_is_the_busy_share_of_the_given_cores_between_two_reads():
    reads = iter([{0: (100, 1000), 1: (500, 1000), 2: (0, 1000)}, {0: (190, 1100), 1: (510, 1100), 2: (100, 1100)}])
    slept = []
    # cores 0 and 1: (90 + 10) busy of (100 + 100) jiffies; core 2 is not the driver's
    assert cores_busy({0, 1}, 0.3, read=lambda: next(reads), sleep=slept.append) == pytest.approx(0.5)
    assert slept == [0.3]
    assert cores_busy({0}, 0.1, read=lambda: {0: (7, 9)}, sleep=lambda s: None) == 0.0  # no time passed: not busy
    assert 0.0 <= cores_busy(set(os.sched_getaffinity(0)), 0.05) <= 1.0  # the real /proc/stat


@pytest.mark.timeout(30)
def test_the_run_pins_only_on_an_idle_machine_unless_told_to_pin_anyway(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5, 7})
    idle, loaded = (lambda cores: 0.05), (lambda cores: 0.6)
    n, why = pinning(_cfg(1), busy=idle)
    assert n == 1 and "cores pinned" in why
    n, why = pinning(_cfg(1), busy=loaded)
    assert n == 0 and "60% busy" in why and "cluster.pin_only_when_idle" in why  # says why, and the key to change
    assert pinning(_cfg(1, only_when_idle=False), busy=loaded)[0] == 1
    assert pinning(_cfg(0), busy=idle) == (0, "") and pinning(_cfg(1, mode="sync"), busy=idle) == (0, "")
    with pytest.raises(ConfigError, match="cluster.pin_trainer_cores = 3.*at most 2"):
        pinning(_cfg(3), busy=loaded)  # refused whatever the load
    # the decision then places every process (0: none pinned, whatever the config says)
    assert pinned_cores(_cfg(1), True, 0) == {} and pinned_cores(_cfg(1), True, 1) == {CPUS_ENV: "3"}


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
            "cluster": {"pin_trainer_cores": 1, "pin_only_when_idle": False},  # pinned even beside other tests' load
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
