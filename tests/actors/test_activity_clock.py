"""ActivityClock (actors/runtime/activity.py): the time accounting loop actors and trainer
ranks share."""

from __future__ import annotations

import threading

import pytest

from asyncflow.actors.runtime.activity import ActivityClock


def test_wait_activities_count_as_waiting_and_others_as_busy():
    clock = ActivityClock("trainer.1", lambda: 4)
    with clock.activity("train"):
        pass
    with clock.activity("wait_data"):
        pass
    clock.add_wait("leader", 2.5)
    stats = clock.stats(num_items=8)
    assert stats.role == "trainer.1" and stats.version == 4 and stats.num_items == 8
    assert stats.busy_s > 0 and set(stats.wait_s) == {"data", "leader"} and stats.wait_s["leader"] >= 2.5
    assert stats.state == "idle"


@pytest.mark.timeout(10)
def test_stats_from_another_thread_count_the_activity_in_progress_and_name_it():
    clock = ActivityClock("rollout.0", lambda: 0)
    inside, leave = threading.Event(), threading.Event()

    def work():
        with clock.activity("generate"):
            inside.set()
            leave.wait(5)

    worker = threading.Thread(target=work)
    worker.start()
    inside.wait(5)
    running = clock.stats(num_items=0)
    leave.set()
    worker.join(5)
    assert running.state == "generate" and running.busy_s > 0
    assert clock.stats(num_items=0, state="paused").state == "paused"
