"""The driver's restart policy (actors/driver/_restarts.py), alone: budget, window, backoff."""

from __future__ import annotations

import pytest

from asyncflow.actors.driver._restarts import MAX_BACKOFF_S, RestartPolicy


@pytest.mark.timeout(10)
def test_the_first_restart_is_immediate_and_each_further_one_waits_twice_as_long():
    policy = RestartPolicy(max_restarts=10, window_s=1000.0, backoff_s=1.0)
    assert [policy.on_death("reward", 0.0) for _ in range(5)] == [0.0, 1.0, 2.0, 4.0, 8.0]


@pytest.mark.timeout(10)
def test_the_backoff_stops_growing_at_its_cap():
    policy = RestartPolicy(max_restarts=100, window_s=1e9, backoff_s=1.0)
    delays = [policy.on_death("reward", 0.0) for _ in range(20)]
    assert max(delays) == MAX_BACKOFF_S and delays[-1] == MAX_BACKOFF_S


@pytest.mark.timeout(10)
def test_a_role_past_its_budget_within_the_window_is_refused_and_other_roles_are_not():
    policy = RestartPolicy(max_restarts=2, window_s=100.0, backoff_s=0.5)
    assert policy.on_death("reward", 10.0) == 10.0
    assert policy.on_death("reward", 11.0) == 11.5
    assert policy.on_death("reward", 12.0) is None
    assert policy.on_death("rollout", 12.0) == 12.0  # the budget is per role
    assert policy.num_recent("reward", 12.0) == 2


@pytest.mark.timeout(10)
def test_restarts_older_than_the_window_no_longer_count():
    policy = RestartPolicy(max_restarts=2, window_s=100.0, backoff_s=1.0)
    policy.on_death("reward", 0.0)
    policy.on_death("reward", 50.0)
    assert policy.on_death("reward", 99.0) is None
    assert policy.on_death("reward", 100.5) == 101.5  # the restart at 0.0 left the window; the one at 50.0 still counts


@pytest.mark.timeout(10)
def test_a_budget_of_zero_refuses_every_restart():
    assert RestartPolicy(max_restarts=0, window_s=10.0, backoff_s=1.0).on_death("reward", 0.0) is None
