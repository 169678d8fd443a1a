"""A new built-in role with devices is its module (an actor and its ``RoleSpec``), its config
section (with ``devices``) and one line in ``topology.BUILT_IN``: nothing in ``config/names.py``,
``[cluster]`` or the other sections. Planted here, in the test, with no process."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest
from msgspec import Meta

from asyncflow.actors.driver import topology
from asyncflow.actors.driver.supervisor import num_devices, visible_devices
from asyncflow.actors.roles.column_role import ColumnRole
from asyncflow.actors.runtime.spec import Devices, RoleSpec, numbered
from asyncflow.config import names
from asyncflow.config._section import Section
from asyncflow.config.load import ConfigError
from asyncflow.config.roles import RoleEntry
from asyncflow.config.run import RunConfig, validate
from asyncflow.core.host import class_path
from asyncflow.engines.config import Count, NonNegInt

pytestmark = pytest.mark.timeout(30)


class Scorer(ColumnRole):
    """The role's actor: a column role that scores each response."""

    inputs = ("response_ids",)


class ScorerConfig(Section):
    """``[scorer]``: its own section, with its replicas and their devices."""

    num_replicas: Annotated[Count, Meta(description="Scorer processes.")] = 1
    devices: Annotated[list[NonNegInt], Meta(description="Accelerator ids, one per replica.")] = msgspec.field(
        default_factory=list
    )


class ScorerRun(RunConfig):
    """The run's config with the new section (in the package: one field of ``RunConfig``)."""

    scorer: ScorerConfig = msgspec.field(default_factory=ScorerConfig)


ROLE = RoleSpec(
    name="scorer",
    actor=Scorer,
    instances=numbered("scorer", lambda cfg: cfg.scorer.num_replicas),
    task="scorer",
    outputs=("score",),
    restartable=True,
    device=Devices.ONE,
    kwargs=lambda layout, name: {"task": "scorer", "output": "score"},
)


@pytest.fixture
def registered(monkeypatch):
    """``ROLE`` as one more line of ``BUILT_IN``, before the training group."""
    outside = [r for r in topology.BUILT_IN if not r.train_group]
    monkeypatch.setattr(topology, "BUILT_IN", [*outside, ROLE, *[r for r in topology.BUILT_IN if r.train_group]])


def _cfg(**scorer) -> ScorerRun:
    cfg = ScorerRun(cluster=msgspec.structs.replace(RunConfig().cluster, device="cuda"), scorer=ScorerConfig(**scorer))
    validate(cfg)
    return cfg


def test_a_role_in_built_in_gets_its_hosts_task_and_devices_from_its_spec_and_its_section_alone(registered):
    cfg = _cfg(num_replicas=2, devices=[6, 7])
    hosts = {h.name: h for h in topology.plan_hosts(cfg, "/run")}
    assert list(hosts) == ["queue", "shard.0", "loader", "rollout.0", "reward.0", "scorer.0", "scorer.1", "trainer"]
    scorer = hosts["scorer.1"]
    assert scorer.kind == "scorer" and scorer.role is ROLE and scorer.workers == ["scorer.1"]
    assert (scorer.specs[-1].name, scorer.specs[-1].cls) == ("scorer.1", class_path(Scorer))
    assert msgspec.msgpack.decode(scorer.specs[-1].kwargs) == {"run_dir": "/run", "task": "scorer", "output": "score"}
    assert "scorer" in topology.tasks(topology.roles_of(cfg), cfg)
    assert "tq.controller.scorer" in [s.name for s in hosts["queue"].specs]
    assert visible_devices(ROLE, "scorer.0", cfg) == "6" and visible_devices(ROLE, "scorer.1", cfg) == "7"
    assert visible_devices(ROLE, "scorer.2", cfg) is None  # one the planner adds beyond the list sees every device
    assert num_devices(ROLE, cfg) == 1
    assert topology.computes("scorer.1")
    trainer = msgspec.msgpack.decode(hosts[names.TRAINER].specs[-1].kwargs)
    assert trainer["other_roles"] == ["loader", "rollout.0", "reward.0", "scorer.0", "scorer.1"]


def test_without_devices_in_its_section_each_instance_sees_every_device(registered):
    cfg = _cfg(num_replicas=2)
    assert [visible_devices(ROLE, f"scorer.{i}", cfg) for i in range(2)] == [None, None]


def test_a_custom_role_may_not_take_the_name_of_a_built_in_role_from_its_spec_alone(registered):
    cfg = msgspec.structs.replace(_cfg(), roles=[RoleEntry(name="scorer", cls=f"{__name__}:Scorer", task="judge")])
    with pytest.raises(ConfigError, match=r"roles.name = 'scorer': this name belongs to a built-in role; choose another"):
        topology.roles_of(cfg)
