"""EchoActor: answers ``Echo`` with itself. Used by `afctl bench transport`, health
checks and the runtime's tests. Takes: Echo, Ping, Stop. Sends: Echo, Ok."""

from __future__ import annotations

from asyncflow.core import protocol
from asyncflow.core.actor import DEFER, Actor


class EchoActor(Actor):
    Inbox = protocol.EchoIn

    def __init__(self, ctx):
        super().__init__(ctx)
        self.num_told = 0

    def handle(self, msg, pending):
        match msg:
            case protocol.Echo(fail=fail) if fail:
                raise ValueError(fail)
            case protocol.Echo(delay_s=delay_s) if delay_s > 0 and pending is not None:
                self.call_later(delay_s, lambda: pending.resolve(msg))
                return DEFER
            case protocol.Echo():
                self.num_told += pending is None
                return msg
            case protocol.Stop():
                return protocol.Ok()
