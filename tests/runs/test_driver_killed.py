"""``afctl up`` killed with kill -9: no stop path runs in the driver, so its hosts clean up
after it. The last of them out removes the run's ipc directory, and each one exits within
``ORPHAN_GRACE_S`` of the signal that told it, by its own recorded decision (core/host.py)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from wf_helpers import afctl, child_hosts, wait_for_steps, write_config

from asyncflow.core.host import ORPHAN_GRACE_S

HOSTS_GONE_S = 60.0  # far past ORPHAN_GRACE_S: only a host that never exits reaches it

DECISION = re.compile(r"driver \(pid (\d+)\) is gone, signalled at monotonic ([\d.]+): .* exits by monotonic ([\d.]+)")


def _alive(pid: int) -> bool:
    """Running (a zombie has exited: nobody may be left to reap an orphan)."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """A tiny run whose driver was killed with kill -9 after its first step, once its hosts are gone:
    (run dir, ipc dir, {host: pid}, the driver's pid, monotonic time just before the kill)."""
    tmp_path = tmp_path_factory.mktemp("killed")
    run_dir = tmp_path / "run"
    proc = afctl("up", str(write_config(tmp_path, num_steps=10_000)), "--run-dir", str(run_dir))
    try:
        wait_for_steps(run_dir, proc, 1, 200)
        hosts = child_hosts(proc.pid)
        ipc_dir = json.loads((run_dir / "cluster.json").read_text())["transport"]["ipc_dir"]
        assert hosts and ipc_dir and Path(ipc_dir).is_dir(), (hosts, ipc_dir)
        killed_at = time.monotonic()
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + HOSTS_GONE_S
        while any(_alive(pid) for pid in hosts.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = {name: pid for name, pid in hosts.items() if _alive(pid)}
        assert not alive, f"hosts {alive} outlived their killed driver by {HOSTS_GONE_S:g} s"
        yield run_dir, Path(ipc_dir), hosts, proc.pid, killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()


@pytest.mark.timeout(300)
def test_the_last_host_out_removes_the_ipc_directory_of_a_driver_killed_with_kill_9(killed_run):
    _, ipc_dir, hosts, _, _ = killed_run
    left = sorted(p.name for p in ipc_dir.iterdir()) if ipc_dir.exists() else []
    assert not ipc_dir.exists(), f"{ipc_dir} left behind by the killed driver's hosts {sorted(hosts)}: {left}"


@pytest.mark.timeout(300)
def test_each_orphan_decides_to_exit_within_orphan_grace_s_of_the_signal(killed_run):
    run_dir, _, hosts, driver_pid, killed_at = killed_run
    for name in hosts:
        text = (run_dir / "logs" / f"{name}.log").read_text()
        found = DECISION.search(text)
        assert found, f"{name} recorded no decision as an orphan:\n{text[-2000:]}"
        pid, signalled_at, exit_by = int(found[1]), float(found[2]), float(found[3])
        assert pid == driver_pid, found[0]
        assert signalled_at >= killed_at, found[0]  # one clock (CLOCK_MONOTONIC) for every process here
        assert exit_by - signalled_at <= ORPHAN_GRACE_S, f"{name}: {found[0]}"
