"""When the driver asks every role for its busy time (``GetRoleStats``, an ask to each
worker) to put busy fractions on the metrics lines: at once, then only once a new step
has come and the interval has passed, so a step of minutes costs one round of asks, not
one per interval. The collector's RunState counts the steps it took."""

from __future__ import annotations

import pytest

from asyncflow.actors.driver.collector import CollectorActor
from asyncflow.actors.driver.launcher import BusyPoll
from asyncflow.actors.runtime import messages
from asyncflow.core.actor import ActorContext
from asyncflow.core.transport import TransportConfig

pytestmark = pytest.mark.timeout(30)


def test_every_interval_until_the_first_step_then_once_per_new_step():
    poll = BusyPoll(interval_s=2.0)
    assert poll.due(now=100.0, num_steps=0)
    assert not poll.due(now=101.0, num_steps=0)
    assert poll.due(now=102.0, num_steps=0)  # before the first step: the first line gets figures
    assert not poll.due(now=103.5, num_steps=1)  # a step came, but within the interval
    assert poll.due(now=104.5, num_steps=1)
    assert not poll.due(now=110.0, num_steps=1)
    assert not poll.due(now=200.0, num_steps=1)  # a long step: no new line to add them to, no asks
    assert poll.due(now=211.0, num_steps=5)  # several steps since: one round


def test_the_collectors_run_state_counts_the_steps_it_took(tmp_path):
    c = CollectorActor(
        ActorContext("collector", TransportConfig(scheme="inproc")), run_dir=str(tmp_path), num_steps=3, progress=False
    )
    assert c.handle(messages.GetRunState(), None).num_steps == 0
    for step in (1, 2):
        c.handle(messages.StepMetrics(step=step, values={"step": step, "step_time_s": 1.0}), None)
    assert c.handle(messages.GetRunState(), None).num_steps == 2
