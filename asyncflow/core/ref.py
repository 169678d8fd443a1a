"""``ActorRef``: ask (request/reply with a timeout) and tell (one-way, acknowledged
on receipt) to a named actor, the same over inproc, ipc or tcp.

One Req0 socket per (process, address) is shared by every reference; each call
opens its own nng context, so references are safe to use from many threads.

Replies are typed: a request class declares its reply (``class Lookup(Request[Found])``,
``core/protocol.py``), so ``ask(Lookup(...))`` is a ``Found`` to mypy, and a reply of
another type raises ``WrongReply`` (checked on the decoded reply: no extra decode).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pynng

from asyncflow.core import _nngio, frames, protocol
from asyncflow.core.errors import ActorGone, ActorTimeout, AsyncflowError, RemoteError, Unauthorized
from asyncflow.core.transport import TransportConfig, dial, is_tcp, set_context_timeouts

_sockets: dict[tuple[str, int, str], pynng.Req0] = {}  # (address, max message bytes, tls_dir)
_sockets_lock = threading.Lock()
_contexts = threading.local()  # per thread: socket id -> its reusable Req context


def _context_for(sock: pynng.Req0) -> pynng.Context:
    """One Req context per (thread, socket), reused: a new request on a context
    cancels any earlier one, so a late reply to a timed-out ask is discarded."""
    cache = _contexts.__dict__.setdefault("by_socket", {})
    ctx = cache.get(id(sock))
    if ctx is None:
        ctx = cache[id(sock)] = _nngio.new_context(sock)
    return ctx


def _socket_for(address: str, config: TransportConfig) -> pynng.Req0:
    key = (address, config.max_message_bytes, config.tls_dir)
    with _sockets_lock:
        sock = _sockets.get(key)
        if sock is None:
            sock = _sockets[key] = dial(address, config)
        return sock


def close_sockets(which: Callable[[str], bool]) -> int:
    """Close this process's cached client sockets whose address ``which`` picks (those of
    actors that are gone: a dialer to an address nobody listens on redials it forever);
    returns how many. A later call to such an address dials afresh."""
    with _sockets_lock:
        picked = [key for key in _sockets if which(key[0])]
        closed = [_sockets.pop(key) for key in picked]
    cache = _contexts.__dict__.get("by_socket", {})  # this thread's contexts on them (others' hold them until they end)
    for sock in closed:
        cache.pop(id(sock), None)
        _nngio.close_socket(sock)
    return len(closed)


def close_all_sockets() -> None:
    """Close this process's client sockets (at process exit or in tests)."""
    with _sockets_lock:
        for sock in _sockets.values():
            _nngio.close_socket(sock)
        _sockets.clear()
    _contexts.__dict__.pop("by_socket", None)


atexit.register(close_all_sockets)


R = TypeVar("R")


class WrongReply(AsyncflowError, TypeError):
    """An actor answered a request with a reply of another type than the request declares."""

    def __init__(self, actor: str, request: str, expected: tuple[type, ...], received: Any):
        self.actor, self.request, self.received = actor, request, type(received).__name__
        self.expected = [t.__name__ for t in expected]
        super().__init__(
            f"{actor} answered {request} with {self.received}, but {request} is answered with "
            f"{' | '.join(self.expected)} (its Request[...] in core/protocol.py): the actor's handle "
            "returns the wrong reply, or the request's declared reply type is wrong"
        )


class ActorRef:
    """A handle on a remote (or local) actor, by name and address."""

    __slots__ = ("name", "address", "_config", "_secret")

    def __init__(self, name: str, address: str, config: TransportConfig | None = None):
        self.name = name
        self.address = address
        self._config = config or TransportConfig.from_env()
        self._secret = self._config.secret_bytes() if is_tcp(address) else b""

    def __repr__(self) -> str:
        return f"ActorRef({self.name!r}, {self.address!r})"

    @property
    def config(self) -> TransportConfig:
        """The transport this reference talks over (its timeouts: ``core/retry.py``)."""
        return self._config

    def ask(self, msg: protocol.Request[R], timeout_s: float = 30.0, *, sender: str = "", seq: int = 0) -> R:
        """Send ``msg`` and wait for its reply (of the type ``msg`` declares); raises
        ``ActorTimeout``, ``RemoteError`` or ``WrongReply``. ``sender`` and ``seq``: the
        id of a request that may be sent again (``core/retry.py`` sends them)."""
        reply = self._call(protocol.ASK, msg, timeout_s, sender, seq)
        expected = protocol.reply_types(type(msg))
        if expected and not isinstance(reply, expected):
            raise WrongReply(self.name, type(msg).__name__, expected, reply)
        return reply

    def tell(self, msg: Any, timeout_s: float = 10.0, *, sender: str = "", seq: int = 0) -> None:
        """Deliver ``msg`` without waiting for it to be handled (only for its receipt)."""
        self._call(protocol.TELL, msg, timeout_s, sender, seq)

    def _call(self, kind: int, msg: Any, timeout_s: float, sender: str = "", seq: int = 0) -> Any:
        header = protocol.Header(target=self.name, kind=kind, secret=self._secret, timeout_s=timeout_s, sender=sender, seq=seq)
        frame = frames.encode_frame(header, msg)
        msg_type = type(msg).__name__
        try:
            # another thread may close the socket between these two (close_sockets: the
            # actor moved or the run stopped): its context then raises Closed, as below
            ctx = _context_for(_socket_for(self.address, self._config))
            set_context_timeouts(ctx, timeout_s)
            _nngio.send(ctx, frame)
            reply = _nngio.recv(ctx)
        except pynng.Timeout:
            raise ActorTimeout(self.name, self.address, msg_type, timeout_s) from None
        except (pynng.ConnectionReset, pynng.ConnectionRefused, pynng.ConnectionAborted, pynng.Closed) as exc:
            raise ActorGone(self.name, self.address, msg_type, str(exc)) from None
        head_view, body_view = frames.split_frame(reply)
        head = frames.decode_reply_header(head_view)
        if not head.ok:
            cls = Unauthorized if head.error_type == "auth" else RemoteError
            raise cls(self.name, msg_type, head.error_type, head.error)
        return frames.decode_any(body_view)
