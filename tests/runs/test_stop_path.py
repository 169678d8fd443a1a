"""The driver's stop path runs to the end whatever fails inside it."""

from __future__ import annotations

import errno
import json
import logging
import tempfile

import pytest

from asyncflow.actors.driver.collector import CollectorActor
from asyncflow.actors.driver.launcher import Launcher
from asyncflow.actors.driver.topology import HostPlan
from asyncflow.actors.runtime.run_dir import LaunchInfo
from asyncflow.config.load import load_config_text


class _StuckHost:
    """A process host whose stop fails (its process table entry is unreadable, say)."""

    def __init__(self):
        self.asked = False

    def stop(self, timeout_s: float) -> None:
        self.asked = True
        raise OSError(errno.EIO, "Input/output error")


class _Host:
    def __init__(self):
        self.stopped = False

    def stop(self, timeout_s: float) -> None:
        self.stopped = True


@pytest.mark.timeout(60)
def test_a_full_disk_while_writing_the_trace_still_stops_the_hosts_the_collector_and_the_directory(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the cluster pointer file stays in this test
    cfg = load_config_text("[logging]\nprogress = false\n")

    def disk_full(self, path):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(CollectorActor, "write_trace", disk_full)
    launcher = Launcher(cfg, tmp_path, LaunchInfo(model_dir="m", base_model_dir="m", data_path="d"))
    launcher.start()  # nothing planned: no roles; the driver's own actors are what this test stops
    stuck, fine = _StuckHost(), _Host()
    fakes = {"stuck": stuck, "fine": fine}
    launcher.supervisor.spawn = lambda name, *args, **kwargs: fakes[name]
    for name in fakes:
        launcher.supervisor.add(HostPlan(name=name, kind="fake", role=None, specs=[]))
    with caplog.at_level(logging.ERROR, logger="asyncflow.actors.driver.launcher"):
        errors = launcher.stop()
    assert stuck.asked and fine.stopped
    assert not launcher.collector.pykka_ref.is_alive()
    assert not launcher.directory.pykka_ref.is_alive()
    assert json.loads((tmp_path / "cluster.json").read_text())["running"] is False
    assert [stage for stage, _ in errors] == ["stop host stuck", "write trace.json"]
    assert "No space left on device" in caplog.text and "write trace.json" in caplog.text


class _InterruptedHost:
    """A host whose stop is interrupted: Ctrl-C again, or SIGTERM (the CLI raises KeyboardInterrupt for it)."""

    def stop(self, timeout_s: float) -> None:
        raise KeyboardInterrupt


@pytest.mark.timeout(60)
def test_an_interrupt_during_the_stop_still_stops_everything_then_is_raised(tmp_path, monkeypatch):
    # a driver interrupted inside its stop once left its directory and collector actors (threads
    # that keep a process alive) running: it hung at exit, for good, redialling its dead hosts
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg = load_config_text("[logging]\nprogress = false\n")
    launcher = Launcher(cfg, tmp_path, LaunchInfo(model_dir="m", base_model_dir="m", data_path="d"))
    launcher.start()
    fine = _Host()
    fakes = {"interrupted": _InterruptedHost(), "fine": fine}
    launcher.supervisor.spawn = lambda name, *args, **kwargs: fakes[name]
    for name in fakes:
        launcher.supervisor.add(HostPlan(name=name, kind="fake", role=None, specs=[]))
    with pytest.raises(KeyboardInterrupt):
        launcher.stop()
    assert fine.stopped
    assert not launcher.collector.pykka_ref.is_alive()
    assert not launcher.directory.pykka_ref.is_alive()
    assert json.loads((tmp_path / "cluster.json").read_text())["running"] is False


@pytest.mark.timeout(60)
def test_a_start_that_fails_half_way_is_stopped_exactly_as_far_as_it_got(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg = load_config_text("[logging]\nprogress = false\n")
    launcher = Launcher(cfg, tmp_path, LaunchInfo(model_dir="m", base_model_dir="m", data_path="d"))

    def no_processes():
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable: fork")

    monkeypatch.setattr(launcher.supervisor, "spawn_all", no_processes)
    with pytest.raises(OSError, match="fork"):
        launcher.start()
    built = launcher.teardown.names()
    assert built[0] == "stop the processes" and "stop the online planner" not in built
    assert {"stop the roster", "stop the collector", "write trace.json", "stop the directory"} <= set(built)
    assert launcher.stop() == []
    assert not launcher.collector.pykka_ref.is_alive() and not launcher.directory.pykka_ref.is_alive()
    assert launcher.teardown.names() == [] and launcher.stop() == []  # a second stop finds nothing left


@pytest.mark.timeout(60)
def test_a_start_that_fails_before_its_directory_removes_its_ipc_directory_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg = load_config_text("[logging]\nprogress = false\n")
    launcher = Launcher(cfg, tmp_path / "run", LaunchInfo(model_dir="m", base_model_dir="m", data_path="d"))

    def no_port(*args, **kwargs):
        raise OSError(errno.EADDRINUSE, "Address in use")

    monkeypatch.setattr("asyncflow.actors.driver.launcher.start_directory", no_port)
    with pytest.raises(OSError, match="Address in use"):
        launcher.start()
    ipc_dirs = [p for p in tmp_path.iterdir() if p.name.startswith("af-")]
    assert len(ipc_dirs) == 1
    assert launcher.teardown.names() == [f"remove {ipc_dirs[0]}", "close the driver's sockets to the run's actors"]
    assert launcher.stop() == [] and not ipc_dirs[0].exists()
