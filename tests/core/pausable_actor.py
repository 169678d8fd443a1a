"""A role that only answers Pause and Resume (with its pid as state), for the test of
pausing a role whose process is restarted at a new address (test_pause_restarted.py)."""

from __future__ import annotations

import os

from asyncflow.actors.runtime import messages
from asyncflow.core import protocol
from asyncflow.core.actor import Actor


class PausableActor(Actor):
    Inbox = messages.Pause | messages.Resume | protocol.Ping | protocol.Stop

    def handle(self, msg, pending):
        match msg:
            case messages.Pause():
                return messages.Paused(role=self.ctx.name, state=str(os.getpid()).encode())
            case messages.Resume() | protocol.Stop():
                return protocol.Ok()


class StuckActor(Actor):
    """Its Pause never ends in time (a unit of work that hangs): its stop times out."""

    Inbox = messages.Pause | protocol.Ping | protocol.Stop

    def handle(self, msg, pending):
        match msg:
            case messages.Pause():
                import time

                time.sleep(120)
                return messages.Paused(role=self.ctx.name)
            case protocol.Stop():
                return protocol.Ok()
