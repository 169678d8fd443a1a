"""A cpu run that asks for far more threads than the machine has cores says so as it
starts."""

from __future__ import annotations

import pytest

from asyncflow.actors.driver.launcher import oversubscribed
from asyncflow.config.load import load_config_text

pytestmark = pytest.mark.timeout(10)

QUIET = ["queue", "shard.0", "loader", "reward.0"]


def test_sixteen_replicas_on_two_cores_are_named_with_what_to_lower():
    cfg = load_config_text("[rollout]\nnum_replicas = 16")
    hosts = QUIET + [f"rollout.{i}" for i in range(16)] + ["trainer"]
    line = oversubscribed(cfg, hosts, cores=2)
    assert line.startswith("!! 17 computing processes x 1 thread(s) on 2 cores: oversubscribed")
    assert "rollout.num_replicas" in line


def test_the_default_run_and_waiting_processes_do_not_warn():
    cfg = load_config_text("")
    assert oversubscribed(cfg, QUIET + ["rollout.0", "trainer"], cores=2) == ""
    assert oversubscribed(cfg, QUIET * 5 + ["rollout.0", "trainer"], cores=2) == ""  # they mostly wait
