"""Test actors run inside the namespace hosts."""

from __future__ import annotations


from asyncflow.core import protocol
from asyncflow.core.actor import Actor


class RelayActor(Actor):
    """Answers ``Echo(payload=b"<name>")`` by asking the actor ``<name>`` (looked up in
    the directory, so on another node) for an echo, and returns its reply with the
    address this relay reached it at: the traffic is actor to actor, not via the driver."""

    Inbox = protocol.EchoIn

    def handle(self, msg, pending):
        match msg:
            case protocol.Echo(payload=payload):
                target = self.ctx.ref(bytes(payload).decode(), wait_s=5)
                reply = target.ask(protocol.Echo(payload=b"from " + self.ctx.address.encode()), timeout_s=5)
                return protocol.Echo(payload=bytes(reply.payload) + b" | reached " + target.address.encode())
            case protocol.Stop():
                return protocol.Ok()
