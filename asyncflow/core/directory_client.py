"""The directory's client: look up, register and list actors by name.

Apart from ``directory.py`` (the directory actor) because the actor runtime
(``actor.py``: ``ActorContext.directory``) uses it: this module imports only the
request side (``ref.py``), never ``actor.py``, so the two do not import each other.
"""

from __future__ import annotations

from asyncflow.core import protocol
from asyncflow.core.errors import RemoteError
from asyncflow.core.ref import ActorRef
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
        """Forget ``name``; with ``address``, only if it is still registered there."""
        self._cache.pop(name, None)
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
        if refresh or name not in self._cache:
            entry = self.lookup(name, wait_s)
            self._cache[name] = ActorRef(name, entry.address, self.transport)
        return self._cache[name]

    def list(self, prefix: str = "") -> list[protocol.ActorEntry]:
        return self._ref.ask(protocol.ListActors(prefix=prefix), timeout_s=self.transport.connect_timeout_s).entries
