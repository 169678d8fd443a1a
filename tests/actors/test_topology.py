"""A config -> the run's process hosts, as a pure function (actors/driver/topology.py), and
what the supervisor derives from each role's RoleSpec (devices, cores): no process."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from asyncflow.actors.driver import topology
from asyncflow.actors.driver.supervisor import num_devices, visible_devices
from asyncflow.actors.roles.column_role import ColumnRole
from asyncflow.actors.weights.actor import WeightSyncActor
from asyncflow.config import names
from asyncflow.config.cluster import ClusterConfig
from asyncflow.config.load import load_config_text
from asyncflow.config.roles import RoleEntry
from asyncflow.core.host import class_path

pytestmark = pytest.mark.timeout(30)


class Judge(ColumnRole):
    inputs = ("response_ids", "answer")


def _cfg(text: str = ""):
    return load_config_text(text)


def _kwargs(plan) -> dict:
    """The constructor arguments of the host's role actor (its last spec)."""
    return msgspec.msgpack.decode(plan.specs[-1].kwargs)


def test_a_default_config_gives_the_queue_a_shard_and_one_host_per_role_instance_in_start_order():
    hosts = topology.plan_hosts(_cfg(), "/run")
    assert [(h.name, h.kind) for h in hosts] == [
        ("queue", "queue"),
        ("shard.0", "shard"),
        ("loader", names.LOADER),
        ("rollout.0", names.ROLLOUT),
        ("reward.0", names.REWARD),
        ("trainer", names.TRAINER),
    ]
    queue = hosts[0]
    assert [s.name for s in queue.specs] == ["tq.manager", "tq.controller.rollout", "tq.controller.reward", "tq.controller.train"]
    assert all(h.role is None for h in hosts[:2]) and all(h.role is not None for h in hosts[2:])


def test_each_role_host_runs_its_roles_class_with_the_run_dir_and_the_wire_path_is_derived_from_the_class():
    for host in topology.plan_hosts(_cfg(), "/run")[2:]:
        *companions, spec = host.specs  # the role's own actor last, after those sharing its process
        assert spec.name == host.name and spec.cls == class_path(host.role.actor)
        assert [(c.name, c.cls) for c in companions] == [(c.name, class_path(c.actor)) for c in host.role.companions]
        assert _kwargs(host)["run_dir"] == "/run"
    assert class_path(Judge) == f"{__name__}:Judge"


def test_the_weights_actor_starts_in_the_trainers_process_before_the_trainer_and_is_no_worker():
    cfg = _cfg("[rollout]\nnum_replicas = 2\n")
    trainer = next(h for h in topology.plan_hosts(cfg, "/run") if h.name == names.TRAINER)
    weights, spec = trainer.specs
    assert (weights.name, weights.cls) == (names.WEIGHTS, class_path(WeightSyncActor))
    assert msgspec.msgpack.decode(weights.kwargs) == {"run_dir": "/run", "replicas": ["rollout.0", "rollout.1"]}
    assert spec.name == names.TRAINER
    assert names.WEIGHTS not in topology.layout(topology.roles_of(cfg), cfg).workers_outside_training()


def test_replicas_reference_workers_and_trainer_ranks_follow_the_config():
    cfg = _cfg(
        "[rollout]\nnum_replicas = 3\n[algorithm]\nkl_coef = 0.1\n[reference]\nnum_workers = 2\n"
        "[train]\nnum_ranks = 2\n[train.engine]\nfsdp = true\n"
    )
    hosts = {h.name: h for h in topology.plan_hosts(cfg, "/run")}
    assert list(hosts) == [
        "queue",
        "shard.0",
        "loader",
        "rollout.0",
        "rollout.1",
        "rollout.2",
        "reward.0",
        "reference.0",
        "reference.1",
        "trainer",
        "trainer.1",
    ]
    assert "tq.controller.reference" in [s.name for s in hosts["queue"].specs]
    trainer = _kwargs(hosts["trainer"])
    assert trainer["rollout_replicas"] == ["rollout.0", "rollout.1", "rollout.2"]
    assert trainer["ranks"] == ["trainer.1"]
    assert trainer["other_roles"] == ["loader", "rollout.0", "rollout.1", "rollout.2", "reward.0", "reference.0", "reference.1"]
    assert _kwargs(hosts["trainer.1"])["rank"] == 1


def test_no_reference_role_without_kl():
    cfg = _cfg("[reference]\nnum_workers = 2\n")
    assert not [h for h in topology.plan_hosts(cfg, "/run") if h.kind == names.REFERENCE]
    assert names.TASK_REFERENCE not in topology.tasks(topology.roles_of(cfg), cfg)


def test_a_custom_role_is_a_restartable_rolespec_started_before_the_training_group_with_its_task():
    cfg = msgspec.structs.replace(
        _cfg(),
        roles=[
            RoleEntry(name="judge", cls=f"{__name__}:Judge", task="judge", reward_column="judge_score", kwargs={"batch_size": 4})
        ],
    )
    hosts = topology.plan_hosts(cfg, "/run")
    assert [h.name for h in hosts][-2:] == ["judge", "trainer"]
    judge = hosts[-2]
    assert judge.role.actor is Judge and judge.role.restartable and judge.role.task == "judge"
    assert judge.role.outputs == ("judge_score",)
    assert _kwargs(judge) == {"run_dir": "/run", "task": "judge", "output": "judge_score", "batch_size": 4}
    assert "tq.controller.judge" in [s.name for s in hosts[0].specs]
    assert "judge" in _kwargs(hosts[-1])["other_roles"]


def test_what_dies_alone_is_restarted_and_what_it_put_is_kept():
    built_in = {r.name: r for r in topology.BUILT_IN}
    cfg = _cfg()
    assert all(r.devices(cfg) == [] for r in built_in.values())  # a role with a device reads its section's (empty) list
    restartable = {names.ROLLOUT, names.REWARD, names.REFERENCE, names.REWARD_MODEL, names.EVALUATOR}
    assert {n for n, r in built_in.items() if r.restartable} == restartable  # the evaluator holds no rows
    assert built_in[names.ROLLOUT].outputs == ("response_ids", "rollout_logp", "finish")
    assert built_in[names.REWARD].task == names.TASK_REWARD and built_in[names.REWARD].outputs == ("reward",)


def test_devices_one_per_replica_and_the_training_group_shares_its_list_alone_or_splits_it_by_rank():
    rollout, trainer = topology.built_in(names.ROLLOUT), topology.built_in(names.TRAINER)
    rank = topology.built_in(names.TRAINER_RANK)
    base = _cfg()
    cfg = msgspec.structs.replace(
        base,
        cluster=ClusterConfig(device="cuda"),
        rollout=msgspec.structs.replace(base.rollout, devices=[4, 5]),
        train=msgspec.structs.replace(base.train, devices=[0, 1, 2, 3]),
    )
    assert visible_devices(rollout, "rollout.1", cfg) == "5"
    assert visible_devices(rollout, "rollout.2", cfg) is None  # added by the planner beyond the list: sees all
    assert visible_devices(trainer, "trainer", cfg) == "0,1,2,3" and num_devices(trainer, cfg) == 4
    assert num_devices(rollout, cfg) == 1 and num_devices(topology.built_in(names.LOADER), cfg) == 0
    ranks = msgspec.structs.replace(cfg, train=msgspec.structs.replace(cfg.train, num_ranks=2))
    assert visible_devices(trainer, "trainer", ranks) == "0" and visible_devices(rank, "trainer.1", ranks) == "1"
    assert num_devices(trainer, ranks) == 1 and num_devices(rank, ranks) == 1
    assert visible_devices(None, "queue", cfg) is None and num_devices(None, cfg) == 0


def test_the_reference_role_lives_in_its_module_and_one_registry_line_only():
    """Removing a built-in role is deleting its module and its entry in topology.py:
    no other module names its module, class or its names.py constants."""
    import re
    from pathlib import Path

    import asyncflow

    package = Path(asyncflow.__file__).parent
    mentions = re.compile(
        r"actors\.reference\b|\breference\.ROLE\b|ReferenceActor|\bREFERENCE\b|TASK_REFERENCE|"
        r"import [\w, ]*\breference\b"
    )
    naming = sorted(str(p.relative_to(package)) for p in package.rglob("*.py") if mentions.search(p.read_text()))
    assert naming == ["actors/driver/topology.py", "actors/roles/reference.py", "config/names.py"]
    registry = [
        line for line in (package / "actors" / "driver" / "topology.py").read_text().splitlines() if mentions.search(line)
    ]
    assert len(registry) == 2  # its name in the import of the role modules, and its line in BUILT_IN


def test_without_the_reference_roles_spec_no_host_task_device_memory_or_step_line_of_it_is_left(tmp_path, monkeypatch):
    """Role facts come from the RoleSpec alone: with the reference's spec taken out of
    BUILT_IN, a config that asks for a reference (kl_coef > 0) plans no reference host,
    task, device, memory or step-time line, while with it each of them is there."""
    from asyncflow.actors.driver import preflight as _preflight
    from asyncflow.planner import io
    from asyncflow.planner.cpu_peak import parse_cpuinfo
    from asyncflow.toy.tiny import make_tiny_model

    monkeypatch.setattr(io, "local_cpu_peak", lambda path="": parse_cpuinfo("cpu MHz : 2450\nflags : fma avx2\n"))
    model = str(make_tiny_model(tmp_path / "tiny", arch="qwen2", seed=0))
    cfg = _cfg("[algorithm]\nkl_coef = 0.01\n[reference]\ndevices = [3]\n")

    def reference_facts() -> list[str]:
        found = [h.name for h in topology.plan_hosts(cfg, str(tmp_path)) if h.name.startswith("reference")]
        found += [t for t in topology.tasks(topology.roles_of(cfg), cfg) if t == names.TASK_REFERENCE]
        found += [k for k in _preflight.estimate(cfg, model) if k.startswith("reference")]
        found += ["step line"] if "reference" in _preflight.step_estimate(cfg, model, 10.0).line else []
        found += [f"devices {r.name}" for r in topology.roles_of(cfg) if visible_devices(r, names.replica(r.name, 0), cfg) == "3"]
        return found

    assert reference_facts() == ["reference.0", names.TASK_REFERENCE, "reference.0", "step line", "devices reference"]
    monkeypatch.setattr(topology, "BUILT_IN", [r for r in topology.BUILT_IN if r.name != names.REFERENCE])
    assert reference_facts() == []


def test_finding_checkpoints_and_preparing_a_resume_import_no_torch():
    import subprocess
    import sys

    code = (
        "import sys, asyncflow.actors.trainer.checkpoints, asyncflow.actors.driver.prepare, asyncflow.actors.runtime.spec; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


EMULATED = '[rollout.engine]\ntype = "emulated"\n[train.engine]\ntype = "emulated"\n'


def test_emulated_replicas_are_packed_into_shared_processes_and_each_stays_a_worker_and_a_replica():
    from asyncflow.actors.driver.supervisor import Supervisor

    cfg = _cfg(EMULATED + "[rollout]\nnum_replicas = 10\n[cluster]\nactors_per_process = 4\n")
    hosts = topology.plan_hosts(cfg, "/run")
    packed = [h for h in hosts if h.kind == names.ROLLOUT]
    assert [h.name for h in packed] == ["rollout.pack.0", "rollout.pack.1", "rollout.pack.2"]
    assert [h.workers for h in packed] == [
        [f"rollout.{i}" for i in range(4)],
        [f"rollout.{i}" for i in range(4, 8)],
        ["rollout.8", "rollout.9"],
    ]
    assert [s.name for s in packed[2].specs] == ["rollout.8", "rollout.9"]
    assert all(h.workers == [h.name] for h in hosts if h.role is not None and h.kind != names.ROLLOUT)
    sup = Supervisor(cfg, Path("/run"))
    sup.plan(hosts)
    assert sup.replicas() == [f"rollout.{i}" for i in range(10)]
    assert sup.workers() == ["loader", *[f"rollout.{i}" for i in range(10)], "reward.0", "trainer"]
    assert sup.log_file("rollout.5").name == "rollout.pack.1.log"


def test_one_actor_per_process_keeps_a_host_per_replica_named_like_it():
    hosts = topology.plan_hosts(_cfg(EMULATED + "[rollout]\nnum_replicas = 2\n"), "/run")
    assert [h.name for h in hosts if h.kind == names.ROLLOUT] == ["rollout.0", "rollout.1"]
