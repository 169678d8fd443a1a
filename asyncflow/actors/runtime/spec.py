"""RoleSpec: what the driver needs to know about a role, declared once, in the role's
own module (``ROLE = RoleSpec(...)`` at its end).

A role is an actor class run in one process host per instance (``rollout.0``,
``rollout.1``, ...; ``loader``). Its spec names the class as an object (a renamed
class breaks at import time, not in the middle of a run), the queue task it takes
rows from and the columns it puts (what it reads, the actor asks for: a config
decides it), whether a dead instance may be started
again in place, its config section, the devices it runs on, how many instances a
config asks for and the keyword arguments of each. The built-in roles are listed
once, in ``topology.BUILT_IN``; ``[[roles]]`` entries of the config become the same
``RoleSpec`` (``topology.custom_role``).

The wire's ``ActorSpec.cls`` string is derived from the class (``core.host.actor_spec``),
and nowhere else.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from asyncflow.config import names
from asyncflow.config.run import RunConfig
from asyncflow.planner.memory import MemoryFacts


class Devices(enum.Enum):
    """Which accelerators a role's instance sees, of the ``devices`` of its config section
    (``RoleSpec.section``)."""

    NONE = "none"
    """None: it runs on CPU threads only."""
    ONE = "one"
    """Instance i takes device i of the list; an instance beyond the list (or any, with an
    empty list) sees them all."""
    GROUP = "group"
    """The training group: alone (``train.num_ranks = 1``) it sees the whole list; with
    several ranks, rank r takes device r."""


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The instance names of every role of a run, which some roles' constructor
    arguments need (the trainer pauses every other worker and drives its ranks)."""

    names: dict[str, list[str]]
    """Role name -> its instances' names, in start order."""
    train_group: list[str]
    """Names of the roles of the training group (``RoleSpec.train_group``)."""

    def of(self, role: str) -> list[str]:
        return self.names.get(role, [])

    def workers_outside_training(self) -> list[str]:
        return [n for role, ns in self.names.items() if role not in self.train_group for n in ns]


@dataclass(frozen=True, kw_only=True)
class StepWork:
    """What one trainer step asks of a role's instances, for the preflight's estimate of a
    step's time (``driver/preflight.step_estimate``): FLOPs per parameter and token of the step,
    spread over ``units`` (cores on a cpu, devices otherwise), at one of the planner's
    efficiencies (``planner.calibration.Efficiency``)."""

    what: str
    """How the preflight line names it: ``training``, ``generation``, ``reference forward``."""
    flops_per_param_token: float
    """6 to train (forward and backward), 2 for a forward or to generate; x2 with a critic."""
    units: int
    efficiency: Literal["train", "prefill", "forward"]
    bfloat16: bool = False
    """It computes in bfloat16 (the cpu peak of bfloat16 instructions applies)."""


def compute_units(cfg: RunConfig, cores: int, instances: int, threads: int | None = None, devices_each: int = 1) -> int:
    """``StepWork.units``: on a cpu (``cores`` > 0) the threads of ``instances`` processes
    (``threads``, else ``cluster.threads_per_process``) up to the machine's cores; on
    accelerators (``cores`` = 0) ``devices_each`` per instance."""
    if cores:
        return max(1, min(cores, (threads or cfg.cluster.threads_per_process) * instances))
    return max(1, instances * devices_each)


def no_kwargs(layout: Layout, name: str) -> dict:
    return {}


def no_devices(cfg: RunConfig) -> list[tuple[str, str]]:
    return []


@dataclass(frozen=True, kw_only=True)
class RoleSpec:
    name: str
    """The role's name (``config/names.py``): the restart budget's key, the name of a single
    instance, the prefix of numbered ones."""
    actor: type
    """The actor class (a ``core.actor.Actor`` subclass)."""
    instances: Callable[[RunConfig], list[str]]
    """The names of its instances for a config (``one`` or ``numbered``); none: not started."""
    task: str = ""
    """The queue task it takes rows from (empty: none)."""
    takes_task: Callable[[RunConfig], bool] = field(default=lambda cfg: True)
    """Whether its instances take rows from ``task`` in this config (a rollout replica
    that only serves the gateway takes none: ``[rollout.gateway] train``)."""
    outputs: tuple[str, ...] = ()
    """The columns it puts: rows a dead instance already put them for are acked, not redone."""
    restartable: bool = False
    """A dead instance is requeued and started again in place (``_restarts.py``);
    otherwise its death stops the run (resume from the last checkpoint)."""
    device: Devices = Devices.NONE
    """Which of its section's ``devices`` each instance sees (``Devices.NONE``: it has none)."""
    devices_used: Callable[[RunConfig], list[tuple[str, str]]] = field(default=no_devices)
    """The config keys (dotted) that say what device its instances compute on, with their
    values: the preflight refuses a device this machine lacks by its key, before any
    process starts (a role with no instance in the config is not checked)."""
    section: str = ""
    """The config section of the role (a field of ``RunConfig``), which holds its ``devices``
    when it has a ``device``; empty: the section named like the role (``[rollout]``,
    ``[reference]``; the trainer's is ``[train]``)."""
    memory: Callable[[RunConfig, MemoryFacts], float] | None = None
    """Bytes of one instance's states (weights, optimizer states, KV budget, staged
    snapshots: ``planner/memory.py``); None: it holds no model. The preflight adds up
    those of every instance the config starts and refuses a run the host cannot hold."""
    working_memory: Callable[[RunConfig, MemoryFacts], float] | None = None
    """Bytes one instance needs beyond its states while it works (its runtime, a
    trainer's activations of one micro-batch at the data's mean prompt length): an
    estimate, added when the preflight knows the prompts' length."""
    step_work: Callable[[RunConfig, int], StepWork] | None = None
    """What a step asks of its instances, given the machine's cores (0: accelerators), for
    the preflight's estimate of a step's time; None: nothing the estimate counts."""
    train_group: bool = False
    """Part of the training group: started after every other worker (which it pauses at
    checkpoints), stopped after them, given the pinned cores (``pin_trainer_cores``)."""
    kwargs: Callable[[Layout, str], dict] = field(default=no_kwargs)
    """Constructor keyword arguments of instance ``name`` besides ``run_dir`` (always given)."""
    companions: tuple[Companion, ...] = ()
    """Actors started in each instance's process before the role's own actor, e.g. the
    trainer's ``weights`` (which takes the trainer's weight snapshots without a copy).
    They are not workers: no StartWork, no stats; they stop with their process."""

    def devices(self, cfg: RunConfig) -> list[int]:
        """The device ids its instances share out (``Devices``): its section's ``devices``;
        none for a role without a device."""
        if self.device is Devices.NONE:
            return []
        return list(getattr(cfg, self.section or self.name).devices)


@dataclass(frozen=True, kw_only=True)
class Companion:
    """An actor that lives in the process of a role's instance (``RoleSpec.companions``)."""

    name: str
    actor: type
    kwargs: Callable[[Layout, str], dict] = field(default=no_kwargs)
    """Its constructor keyword arguments besides ``run_dir``, given the layout and the
    name of the instance whose process it shares."""


def task_of(role: RoleSpec, cfg: RunConfig) -> str:
    """The queue task ``role`` takes rows from in ``cfg`` (empty: none)."""
    return role.task if role.task and role.takes_task(cfg) else ""


def one(name: str) -> Callable[[RunConfig], list[str]]:
    """``instances`` of a role with exactly one instance, named like the role."""
    return lambda cfg: [name]


def numbered(prefix: str, count: Callable[[RunConfig], int], first: int = 0) -> Callable[[RunConfig], list[str]]:
    """``instances`` of a replicated role: ``prefix.<first>`` ... (``count(cfg)`` of them)."""
    return lambda cfg: [names.replica(prefix, i) for i in range(first, first + count(cfg))]


def index_of(name: str) -> int:
    """The number of an instance (``rollout.3`` -> 3); 0 for a name without one."""
    head, _, tail = name.rpartition(".")
    return int(tail) if head and tail.isdigit() else 0
