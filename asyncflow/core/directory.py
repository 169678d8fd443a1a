"""The directory: actors find each other by name.

Takes: Register, Unregister, Lookup (waits up to ``wait_s`` for the name), ListActors,
Ping, Stop. Sends: Ok, Found, ActorList. Invariant: a name maps to one address; a
second Register of a live name replaces it (a restarted role re-registers).
"""

from __future__ import annotations

from asyncflow.core import protocol
from asyncflow.core.actor import DEFER, Actor, ActorContext, Pending, ServedActor, serve_actor
from asyncflow.core.errors import RemoteError
from asyncflow.core.ref import ActorRef
from asyncflow.core.transport import TransportConfig

DIRECTORY_NAME = "directory"


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


class DirectoryClient:
    """Client of the directory, with a cache of resolved references."""

    def __init__(self, address: str, transport: TransportConfig | None = None):
        self.address = address
        self.transport = transport or TransportConfig.from_env()
        self._ref = ActorRef(DIRECTORY_NAME, address, self.transport)
        self._cache: dict[str, ActorRef] = {}

    def register(self, entry: protocol.ActorEntry) -> None:
        self._ref.ask(protocol.Register(entry=entry), timeout_s=self.transport.connect_timeout_s)

    def unregister(self, name: str, address: str = "", timeout_s: float | None = None) -> None:
        """Forget ``name``; with ``address``, only if it is still registered there."""
        self._cache.pop(name, None)
        self._ref.ask(protocol.Unregister(name=name, address=address),
                      timeout_s=self.transport.connect_timeout_s if timeout_s is None else timeout_s)

    def lookup(self, name: str, wait_s: float = 0.0) -> protocol.ActorEntry:
        try:
            found = self._ref.ask(protocol.Lookup(name=name, wait_s=wait_s), timeout_s=wait_s + self.transport.connect_timeout_s)
        except RemoteError as exc:
            raise LookupError(f"{exc.detail} (directory at {self.address})") from None
        return found.entry

    def ref(self, name: str, wait_s: float = 10.0, refresh: bool = False) -> ActorRef:
        if refresh or name not in self._cache:
            entry = self.lookup(name, wait_s)
            self._cache[name] = ActorRef(name, entry.address, self.transport)
        return self._cache[name]

    def list(self, prefix: str = "") -> list[protocol.ActorEntry]:
        return self._ref.ask(protocol.ListActors(prefix=prefix), timeout_s=self.transport.connect_timeout_s).entries


def start_directory(transport: TransportConfig, address: str | None = None) -> ServedActor:
    """Serve a directory in this process (the driver's)."""
    return serve_actor(DirectoryActor, DIRECTORY_NAME, transport, address=address)
