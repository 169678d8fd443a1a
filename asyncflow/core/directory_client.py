"""The directory's client: look up, register and list actors by name.

Apart from ``directory.py`` (the directory actor) because the actor runtime
(``actor.py``: ``ActorContext.directory``) uses it: this module imports only the
request side (``ref.py``), never ``actor.py``, so the two do not import each other.
"""

from __future__ import annotations

from asyncflow.core import protocol
from asyncflow.core.errors import RemoteError
from asyncflow.core.ref import ActorRef, close_sockets
from asyncflow.core.transport import TransportConfig

DIRECTORY_NAME = "directory"


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
        """Forget ``name``; with ``address``, only if it is still registered there. This
        process's socket to the cached address goes too (see ``ref``)."""
        self._drop(self._cache.pop(name, None))
        self._ref.ask(
            protocol.Unregister(name=name, address=address),
            timeout_s=self.transport.connect_timeout_s if timeout_s is None else timeout_s,
        )

    def lookup(self, name: str, wait_s: float = 0.0) -> protocol.ActorEntry:
        try:
            found = self._ref.ask(protocol.Lookup(name=name, wait_s=wait_s), timeout_s=wait_s + self.transport.connect_timeout_s)
        except RemoteError as exc:
            raise LookupError(f"{exc.detail} (directory at {self.address})") from None
        return found.entry

    def ref(self, name: str, wait_s: float = 10.0, refresh: bool = False) -> ActorRef:
        """The reference to ``name``, cached; ``refresh`` looks it up again (a restart
        moves an actor to a fresh address). A refresh that finds a new address closes this
        process's socket to the old one: that address was the dead instance's alone, and
        a cached dialer to it would redial it every 20-500 ms for the rest of the process."""
        cached = self._cache.get(name)
        if refresh or cached is None:
            entry = self.lookup(name, wait_s)
            if cached is None or cached.address != entry.address:
                self._cache[name] = ActorRef(name, entry.address, self.transport)
                self._drop(cached)
        return self._cache[name]

    def _drop(self, gone: ActorRef | None) -> None:
        """Close this process's socket to ``gone``'s address, unless a cached name still uses it."""
        if gone is not None and gone.address != self.address and all(r.address != gone.address for r in self._cache.values()):
            close_sockets(gone.address.__eq__)

    def list(self, prefix: str = "") -> list[protocol.ActorEntry]:
        return self._ref.ask(protocol.ListActors(prefix=prefix), timeout_s=self.transport.connect_timeout_s).entries
