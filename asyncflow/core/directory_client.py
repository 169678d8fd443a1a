"""The directory's client: look up, register and list actors by name.

Apart from ``directory.py`` (the directory actor) because the actor runtime
(``actor.py``: ``ActorContext.directory``) uses it: this module imports only the
request side (``ref.py``), never ``actor.py``, so the two do not import each other.
"""

from __future__ import annotations

import threading

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
        self._lock = threading.Lock()  # the cache: an actor's threads share its context's client

    def register(self, entry: protocol.ActorEntry) -> None:
        self._ref.ask(protocol.Register(entry=entry), timeout_s=self.transport.connect_timeout_s)

    def unregister(self, name: str, address: str = "", timeout_s: float | None = None) -> None:
        """Forget ``name``; with ``address``, only if it is still registered there. This
        process's socket to the cached address goes too (see ``ref``)."""
        with self._lock:
            gone = self._forget(self._cache.pop(name, None))
        if gone:
            close_sockets(gone.__eq__)
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
        if cached is not None and not refresh:
            return cached
        entry = self.lookup(name, wait_s)
        with self._lock:
            cached = self._cache.get(name)
            if cached is not None and cached.address == entry.address:
                return cached
            fresh = self._cache[name] = ActorRef(name, entry.address, self.transport)
            gone = self._forget(cached)
        if gone:
            close_sockets(gone.__eq__)
        return fresh

    def _forget(self, old: ActorRef | None) -> str:
        """``old``'s address if nothing cached uses it any more (and it is not the
        directory's), else "". Called with ``_lock`` held, ``old`` out of the cache."""
        if old is None or old.address == self.address or any(r.address == old.address for r in self._cache.values()):
            return ""
        return old.address

    def list(self, prefix: str = "") -> list[protocol.ActorEntry]:
        return self._ref.ask(protocol.ListActors(prefix=prefix), timeout_s=self.transport.connect_timeout_s).entries
