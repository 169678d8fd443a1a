"""The freeze watch (actors/driver/_freezes.py): a host silent for FROZEN_AFTER_S is named frozen
once, with its /proc state; named again when it answers; overdue (to be killed) past the
freeze timeout; and the driver's own stand-still blames nobody."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from asyncflow.actors.driver._freezes import FreezeWatch, process_state
from asyncflow.core.transport import TransportConfig


@pytest.fixture
def stopped_process():
    proc = subprocess.Popen(["sleep", "60"])
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while process_state(proc.pid) != "T":  # the kernel stops it asynchronously
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


def _watch(silent: dict[str, float]) -> FreezeWatch:
    watch = FreezeWatch(TransportConfig(freeze_timeout_s=100.0), frozen_after_s=10.0)
    watch.heartbeat.silent = lambda: dict(silent)  # type: ignore[method-assign]  # no pings: the silences are given
    return watch


def test_a_silent_host_is_named_frozen_once_with_its_state_then_again_when_it_answers(stopped_process):
    pid = stopped_process.pid
    silent = {"queue": 3.0}
    watch = _watch(silent)
    watch._pids["queue"] = pid  # watched (without a host actor to ping)
    assert watch.review({"queue": pid}).lines == []
    silent["queue"] = 11.0
    (line,) = watch.review({"queue": pid}).lines
    assert f"process queue (pid {pid}) has not answered for 11 s: frozen, not dead" in line
    assert f"state T, stopped by a signal (SIGSTOP, Ctrl-Z): `kill -CONT {pid}` continues it" in line
    assert "freeze_timeout_s = 100 s" in line
    silent["queue"] = 40.0
    review = watch.review({"queue": pid})
    assert review.lines == [] and review.overdue == {}  # named once; not yet overdue
    silent["queue"] = 0.5
    assert watch.review({"queue": pid}).lines == [f"!! process queue (pid {pid}) answers again, after 40 s frozen"]


def test_a_host_frozen_past_the_freeze_timeout_is_overdue_with_the_reason(stopped_process):
    pid = stopped_process.pid
    watch = _watch({"reward.0": 101.0, "loader": 101.0})
    watch._pids.update({"reward.0": pid, "loader": 1})
    review = watch.review({"reward.0": pid, "loader": 2})  # the loader's process is another one now: not judged
    assert list(review.overdue) == ["reward.0"]
    assert "was frozen for 101 s (state T" in review.overdue["reward.0"]
    assert "cluster.transport.freeze_timeout_s = 100) and was killed" in review.overdue["reward.0"]


def test_the_drivers_own_stand_still_is_not_counted_against_the_hosts():
    watch = FreezeWatch(TransportConfig(freeze_timeout_s=100.0), frozen_after_s=10.0)
    beat = watch.heartbeat
    beat.watch("queue", "host.queue", "inproc://nobody")
    now = time.monotonic()
    beat._last_answer["queue"] = now - 60  # no answer for a minute...
    beat._last_round = now - 60  # ...because no round of pings ran: the driver itself was stopped
    assert beat.silent()["queue"] < 1.0
    beat._last_answer["queue"] = time.monotonic() - 60  # pings ran and got no answer: the host's silence
    assert beat.silent()["queue"] >= 60
    beat.forget("queue")
