"""RosterActor: the ``roster`` actor, in the driver's process: which rollout replicas the
run has now, read from the Supervisor's record (the one list of the run's processes).

The weight sync asks it whom to announce each new version to, and the trainer whom to
pause for a checkpoint: a replica the online planner adds or removes (``_scaling.py``
asks the Supervisor) is in or out of their next answer, with nothing else to update.
``afctl status`` asks it the same for its row, never GetRoleStats, which it does not
take (a message an actor cannot decode logs a warning in the run).

Constructed by the launcher with ``replicas``, a function of no argument returning the
names (``Supervisor.replicas``: a copy taken under its lock, so the driver's thread may
change the record meanwhile).

Takes: GetReplicas, Ping, Stop. Sends nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from asyncflow.actors.runtime import messages
from asyncflow.core import protocol
from asyncflow.core.actor import Actor


class RosterActor(Actor):
    Inbox = messages.RosterIn

    def __init__(self, ctx, replicas: Callable[[], list[str]]):
        super().__init__(ctx)
        self.replicas = replicas

    def handle(self, msg, pending):
        match msg:
            case messages.GetReplicas():
                return messages.Replicas(names=self.replicas())
            case protocol.Stop():
                return protocol.Ok()
            case _:
                raise TypeError(f"{self.ctx.name} does not handle {type(msg).__name__}")
