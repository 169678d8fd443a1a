"""The directory: actors find each other by name.

Takes: Register, Unregister, Lookup (waits up to ``wait_s`` for the name), ListActors,
Ping, Stop. Sends: Ok, Found, ActorList. Invariant: a name maps to one address; a
second Register of a live name replaces it (a restarted role re-registers).

The client (``DirectoryClient``) lives in ``directory_client.py``, which does not
import the actor runtime, so ``actor.py`` can use it without an import cycle; it is
re-exported here.
"""

from __future__ import annotations

from asyncflow.core import protocol
from asyncflow.core.actor import DEFER, Actor, ActorContext, Pending, ServedActor, serve_actor
from asyncflow.core.directory_client import DIRECTORY_NAME, DirectoryClient
from asyncflow.core.transport import TransportConfig

__all__ = ["DIRECTORY_NAME", "DirectoryActor", "DirectoryClient", "start_directory"]


class DirectoryActor(Actor):
    Inbox = protocol.DirectoryIn
    Control = True  # small frames only (control_max_message_bytes)

    def __init__(self, ctx: ActorContext):
        super().__init__(ctx)
        self._entries: dict[str, protocol.ActorEntry] = {}
        self._waiting: dict[str, list[Pending]] = {}

    def handle(self, msg, pending):
        match msg:
            case protocol.Register(entry=entry):
                self._entries[entry.name] = entry
                for waiter in self._waiting.pop(entry.name, []):
                    if not waiter.done:
                        waiter.resolve(protocol.Found(entry=entry))
                return protocol.Ok()
            case protocol.Unregister(name=name, address=address):
                if not address or (name in self._entries and self._entries[name].address == address):
                    self._entries.pop(name, None)
                return protocol.Ok()
            case protocol.Lookup(name=name, wait_s=wait_s):
                if name in self._entries:
                    return protocol.Found(entry=self._entries[name])
                if wait_s <= 0:
                    raise KeyError(f"no actor named {name!r} is registered")
                self._waiting.setdefault(name, []).append(pending)
                self.call_later(wait_s, lambda: self._expire(name, pending, wait_s))
                return DEFER
            case protocol.ListActors(prefix=prefix):
                return protocol.ActorList(
                    entries=sorted((e for n, e in self._entries.items() if n.startswith(prefix)), key=lambda e: e.name)
                )
            case protocol.Stop():
                return protocol.Ok()

    def _expire(self, name: str, pending: Pending, wait_s: float) -> None:
        if not pending.done:
            self._waiting.get(name, []).remove(pending)
            pending.reject(KeyError(f"no actor named {name!r} registered within {wait_s:g} s"))


def start_directory(transport: TransportConfig, address: str | None = None) -> ServedActor:
    """Serve a directory in this process (the driver's)."""
    return serve_actor(DirectoryActor, DIRECTORY_NAME, transport, address=address)
