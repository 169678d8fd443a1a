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


class DistProbeActor(Actor):
    """Rank ``rank`` of a torch.distributed group found through the directory
    (asyncflow.core.rendezvous, as trainer ranks do). ``Echo`` joins the group (every
    rank must be asked at once), all-reduces ``rank + 1``, broadcasts 1 MiB from rank
    0, and answers ``"<sum> <checksum> <interface>"``."""

    Inbox = protocol.EchoIn

    def __init__(self, ctx, rank: int, world_size: int):
        super().__init__(ctx)
        self.rank, self.world_size = rank, world_size

    def handle(self, msg, pending):
        match msg:
            case protocol.Echo():
                import os

                import torch
                import torch.distributed as dist

                from asyncflow.core.rendezvous import init_default_group

                init_default_group(
                    self.ctx.directory, "probe", self.ctx.transport, self.rank, self.world_size, "gloo", timeout_s=30
                )
                total = torch.tensor([float(self.rank + 1)])
                dist.all_reduce(total)
                data = torch.arange(1 << 18, dtype=torch.float32) if self.rank == 0 else torch.zeros(1 << 18)
                dist.broadcast(data, src=0)
                dist.destroy_process_group()
                answer = f"{total.item():.0f} {data.sum().item():.0f} {os.environ.get('GLOO_SOCKET_IFNAME', '')}"
                return protocol.Echo(payload=answer.encode())
            case protocol.Stop():
                return protocol.Ok()
