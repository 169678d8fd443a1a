"""The actor specs of one TransferQueue, for a process host to start.

``queue_specs(["train", "reference"], num_shards=2)`` gives the manager, one
controller per task and the shards, named as the client expects. Where each runs
is the launcher's choice (the bench puts each in its own process, as deployed).
"""

from __future__ import annotations

import msgspec

from asyncflow.core.host import actor_spec
from asyncflow.core.protocol import ActorSpec
from asyncflow.core.tq.client import MANAGER_NAME, controller_name, shard_name
from asyncflow.core.tq.controller import ControllerActor
from asyncflow.core.tq.inline import INLINE_MAX_BYTES
from asyncflow.core.tq.manager import QueueManagerActor
from asyncflow.core.tq.shard import ShardActor


class QueueSpecs(msgspec.Struct, kw_only=True):
    manager: ActorSpec
    controllers: list[ActorSpec]
    shards: list[ActorSpec]

    def all(self) -> list[ActorSpec]:
        return [self.manager, *self.controllers, *self.shards]


def queue_specs(
    tasks: list[str],
    num_shards: int = 1,
    capacity_rows: int = 65536,
    stripe_rows: int = 64,
    inline_max_bytes: int = INLINE_MAX_BYTES,
) -> QueueSpecs:
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    if stripe_rows < 1:
        raise ValueError(f"stripe_rows must be >= 1, got {stripe_rows}")
    controllers = {t: controller_name(t) for t in tasks}
    shards = [shard_name(k) for k in range(num_shards)]
    return QueueSpecs(
        manager=actor_spec(
            MANAGER_NAME,
            QueueManagerActor,
            tasks=list(tasks),
            shards=shards,
            controllers=controllers,
            capacity_rows=capacity_rows,
            stripe_rows=stripe_rows,
        ),
        controllers=[actor_spec(name, ControllerActor, task=task, manager=MANAGER_NAME) for task, name in controllers.items()],
        shards=[
            actor_spec(name, ShardActor, shard=k, controllers=list(controllers.values()), inline_max_bytes=inline_max_bytes)
            for k, name in enumerate(shards)
        ],
    )


class QueueProcesses:
    """Process hosts running one queue; ``stop()`` stops them all."""

    def __init__(self, hosts: list):
        self.hosts = hosts

    def stop(self) -> None:
        for host in self.hosts:
            host.stop()

    def kill(self) -> None:
        for host in self.hosts:
            host.kill()


def spawn_queue(
    directory,
    transport,
    tasks: list[str],
    num_shards: int = 1,
    capacity_rows: int = 65536,
    stripe_rows: int = 64,
    separate: bool = True,
    prefix: str = "tq",
    inline_max_bytes: int = INLINE_MAX_BYTES,
) -> QueueProcesses:
    """Start a queue in process hosts: with ``separate``, the manager with the
    controllers in one process and each shard in its own (as deployed); otherwise all
    of it in one process."""
    from asyncflow.core.host import spawn_host

    specs = queue_specs(tasks, num_shards, capacity_rows, stripe_rows, inline_max_bytes)
    hosts = []
    try:
        if separate:
            hosts.append(spawn_host(f"{prefix}-control", directory, transport, [specs.manager, *specs.controllers]))
            for k, spec in enumerate(specs.shards):
                hosts.append(spawn_host(f"{prefix}-shard-{k}", directory, transport, [spec]))
        else:
            hosts.append(spawn_host(prefix, directory, transport, specs.all()))
    except BaseException:
        QueueProcesses(hosts).stop()
        raise
    return QueueProcesses(hosts)
