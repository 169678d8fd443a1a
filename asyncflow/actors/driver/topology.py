"""A run's topology: the registry of built-in roles, and the pure function from a
config to the process hosts the driver starts (``plan_hosts``), tested without
processes (tests/actors/test_topology.py).

Processes (one host per line)::

    queue       tq.manager, tq.controller.<task>...
    shard.<i>   tq.shard.<i>
    <instance>  one per instance of each role, in this order: the built-in roles
                outside training (BUILT_IN order), the [[roles]] of the config,
                then the training group (trainer rank 0, then ranks 1..)
    rollout.pack.<k>  instead of rollout.<i> with ``cluster.actors_per_process = m > 1``
                (emulated replicas only): replicas km .. km + m - 1, each an actor of
                its own in one process (``HostPlan.workers``)

A new built-in role is one module that ends with ``ROLE = RoleSpec(...)``, its config
section (a field of ``RunConfig``; with ``devices`` when the role has a ``device``) and one
line in ``BUILT_IN``: its hosts, its queue task, the devices each instance sees
(``RoleSpec.devices``) and the refusal of a ``[[roles]]`` entry that takes its name all come
from the spec (tests/actors/test_new_role.py plants one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncflow.actors import rollout
from asyncflow.actors.evaluation import actor as evaluator
from asyncflow.actors.roles import prompt_loader, reference, reward, reward_model
from asyncflow.actors.runtime.spec import Devices, Layout, RoleSpec, one, task_of
from asyncflow.actors.runtime.user_imports import importable
from asyncflow.actors.trainer import actor as trainer
from asyncflow.actors.trainer import rank as trainer_rank
from asyncflow.config import names
from asyncflow.config.load import ConfigError
from asyncflow.config.roles import RoleEntry
from asyncflow.config.run import RunConfig
from asyncflow.core import protocol
from asyncflow.core.host import actor_spec
from asyncflow.core.tq.launch import queue_specs

BUILT_IN: list[RoleSpec] = [
    prompt_loader.ROLE,
    rollout.ROLE,
    reward.ROLE,
    reference.ROLE,
    reward_model.ROLE,
    evaluator.ROLE,
    trainer.ROLE,
    trainer_rank.ROLE,
]
"""Every built-in role, one line each, in start order (the training group last)."""

QUEUE, SHARD = "queue", "shard"
"""Kinds of the queue's hosts, which are no role: their loss stops the run."""


def built_in(name: str) -> RoleSpec:
    return next(r for r in BUILT_IN if r.name == name)


def computes(host: str) -> bool:
    """Whether the host of this name keeps its cores busy: an instance of a built-in role
    with a device (``RoleSpec.device``: rollout, trainer and its ranks, reference, reward
    model). The queue, its shards, the loader and reward workers mostly wait."""
    return any(
        host == spec.name or names.role_of(host) == (names.TRAINER if spec.name == names.TRAINER_RANK else spec.name)
        for spec in BUILT_IN
        if spec.device is not Devices.NONE
    )


def custom_role(entry: RoleEntry, python_path: list[str]) -> RoleSpec:
    """A ``[[roles]]`` entry as a RoleSpec: its class imported from the dotted path the
    user wrote, the way its process will (``cluster.python_path`` first). Its name may
    not be a built-in role's, nor that of one of its instances (``name.<i>``)."""
    if any(entry.name == r.name or entry.name.startswith(f"{r.name}.") for r in BUILT_IN):
        raise ConfigError(f"roles.name = {entry.name!r}: this name belongs to a built-in role; choose another")
    try:
        cls = importable(entry.cls, python_path)
    except ValueError as exc:
        raise ConfigError(f"roles.cls = {entry.cls!r} (role {entry.name!r}): {exc}") from None
    given = {"task": entry.task, "output": entry.reward_column}
    given = {k: v for k, v in given.items() if v}
    return RoleSpec(
        name=entry.name,
        actor=cls,
        instances=one(entry.name),
        task=entry.task,
        outputs=(entry.reward_column,) if entry.reward_column else (),
        restartable=True,
        kwargs=lambda layout, name: {**given, **entry.kwargs},
    )


def roles_of(cfg: RunConfig) -> list[RoleSpec]:
    """The roles of a run in start order: built-in workers, custom roles, the training group."""
    custom = [custom_role(entry, cfg.cluster.python_path) for entry in cfg.roles]
    return [r for r in BUILT_IN if not r.train_group] + custom + [r for r in BUILT_IN if r.train_group]


def tasks(roles: list[RoleSpec], cfg: RunConfig) -> list[str]:
    """The queue's tasks: that of every role with an instance (each a controller)."""
    return [task_of(r, cfg) for r in roles if task_of(r, cfg) and r.instances(cfg)]


@dataclass(frozen=True, kw_only=True)
class HostPlan:
    """One process host to start: its name, what kind it is and the actors it runs."""

    name: str
    kind: str
    """The role's name, or QUEUE / SHARD."""
    role: RoleSpec | None
    """None for the queue's hosts."""
    specs: list[protocol.ActorSpec]
    workers: list[str] = field(default_factory=list)
    """The role instances it runs (StartWork, stats, Stop, requeue each): its own name, or the
    replicas packed into it; none for the queue's hosts. Its other specs are companions."""


def layout(roles: list[RoleSpec], cfg: RunConfig) -> Layout:
    return Layout(names={r.name: r.instances(cfg) for r in roles}, train_group=[r.name for r in roles if r.train_group])


def role_host(role: RoleSpec, name: str, lay: Layout, run_dir: str) -> HostPlan:
    """The host of one instance of ``role`` (also how the planner adds a replica)."""
    companions = [actor_spec(c.name, c.actor, run_dir=run_dir, **c.kwargs(lay, name)) for c in role.companions]
    return HostPlan(
        name=name,
        kind=role.name,
        role=role,
        specs=[*companions, actor_spec(name, role.actor, run_dir=run_dir, **role.kwargs(lay, name))],
        workers=[name],
    )


PACK = "pack"
"""``rollout.pack.<k>``: a process of packed replicas (``cluster.actors_per_process``)."""


def packed_host(role: RoleSpec, index: int, instances: list[str], lay: Layout, run_dir: str) -> HostPlan:
    """One process running several instances of ``role``, each with its companions before it."""
    specs = [spec for name in instances for spec in role_host(role, name, lay, run_dir).specs]
    return HostPlan(name=f"{role.name}.{PACK}.{index}", kind=role.name, role=role, specs=specs, workers=list(instances))


def role_hosts(role: RoleSpec, lay: Layout, cfg: RunConfig, run_dir: str) -> list[HostPlan]:
    """The hosts of every instance of ``role``: one each, or the rollout replicas packed
    ``cluster.actors_per_process`` to a process."""
    instances, per = lay.of(role.name), cfg.cluster.actors_per_process
    if role.name != names.ROLLOUT or per == 1:
        return [role_host(role, name, lay, run_dir) for name in instances]
    return [packed_host(role, k, instances[i : i + per], lay, run_dir) for k, i in enumerate(range(0, len(instances), per))]


def plan_hosts(cfg: RunConfig, run_dir: str, roles: list[RoleSpec] | None = None) -> list[HostPlan]:
    """Every process host of a run, in start order (pure: no process, no file)."""
    roles = roles_of(cfg) if roles is None else roles
    # refill keeps headroom free of new steps (actors/roles/prompt_loader.py): the default adds it, so the look-ahead stays
    capacity = cfg.queue.capacity_rows or cfg.rows_per_step * (cfg.staleness + 3) + cfg.refill_headroom_rows
    q = queue_specs(
        tasks(roles, cfg), num_shards=cfg.queue.num_shards, capacity_rows=capacity, inline_max_bytes=cfg.queue.inline_max_bytes
    )
    hosts = [HostPlan(name=QUEUE, kind=QUEUE, role=None, specs=[q.manager, *q.controllers])]
    hosts += [HostPlan(name=f"{SHARD}.{i}", kind=SHARD, role=None, specs=[s]) for i, s in enumerate(q.shards)]
    lay = layout(roles, cfg)
    return hosts + [h for r in roles for h in role_hosts(r, lay, cfg, run_dir)]
