"""Actors: pykka actors reachable over nng.

An actor subclasses :class:`Actor`, names its inbox union (``Inbox``) and
implements ``handle(msg, pending)``. ``serve_actor`` starts it and a listener
whose receive thread decodes frames and hands them to the actor's pykka inbox.

Rules:
- ``handle`` runs in the actor's own thread, one message at a time.
- For an ask, the value ``handle`` returns is the reply. To answer later (a
  blocking ``GetBatch`` waiting for rows), keep ``pending``, return ``DEFER``, and
  call ``pending.resolve(reply)`` or ``pending.reject(exc)`` when ready.
- An exception in ``handle`` goes back to the asker as a ``RemoteError`` naming the
  actor and message; for a tell it is logged loudly and the actor keeps serving
  (pykka would stop the actor; a bad message must not take down a role).
- Malformed frames (random bytes, truncated, wrong schema, nested too deep) are
  rejected with an error reply and counted (``num_rejected_frames``, also in every
  ``Pong``), with a log line at most every ``REJECT_LOG_INTERVAL_S``; the listener
  keeps serving. Any exception while serving one frame is contained the same way:
  no frame ends the receive thread.
- tcp requests without the cluster secret are refused (``auth``) and counted; the
  secret is read from the header's fixed prefix before the header is decoded.
- A resendable request (its header names a ``sender`` and ``seq``: ``core/retry.py``)
  is served once however many copies of it come (a caller resends to a peer that was
  frozen): the copies get the first one's answer (``core/replay.py``).
- Inside one process a message may also be handed to the actor's pykka inbox
  (``served.pykka_ref.ask(msg)``): a plain class carrying Python objects that must not
  be copied (a weight snapshot), or a wire message. It reaches ``handle(msg, None)``
  in the actor's thread, its return value is the reply. An actor's fields are never
  read or set from outside: ask it.
"""

from __future__ import annotations

import heapq
import hmac
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, ClassVar

import pykka
import pynng

from asyncflow.core import _nngio, frames, protocol
from asyncflow.core.directory_client import DirectoryClient
from asyncflow.core.errors import FrameError
from asyncflow.core.replay import ANSWERED, NEW, STALE, ReplayCache
from asyncflow.core.transport import TransportConfig, is_tcp, listen

log = logging.getLogger(__name__)

REJECT_LOG_INTERVAL_S = 10.0
"""A listener logs at most one rejected frame per this interval (a flood stays quiet)."""

DEFER = object()
"""Returned by ``handle`` when the reply will be sent later through ``pending``."""


ReplyHook = Callable[[bytearray], None]
"""Called with the reply frame of a resendable request once it is sent (``core/replay.py``)."""


class Pending:
    """The reply slot of one ask. Resolve or reject it exactly once, from any thread."""

    __slots__ = ("_ctx", "actor", "message_type", "_done", "_on_reply")

    def __init__(self, ctx: pynng.Context, actor: str, message_type: str, on_reply: ReplyHook | None = None):
        self._ctx = ctx
        self.actor = actor
        self.message_type = message_type
        self._done = False
        self._on_reply = on_reply

    @property
    def done(self) -> bool:
        return self._done

    def resolve(self, reply: Any = None) -> None:
        self._send(frames.ok_reply(reply))

    def reject(self, exc: BaseException) -> None:
        self._send(frames.error_reply("remote", f"{type(exc).__name__}: {exc}"))

    def _send(self, frame: bytearray) -> None:
        if self._done:
            raise RuntimeError(f"{self.actor}: reply to {self.message_type} sent twice")
        self._done = True
        try:
            if self._ctx._context is None:  # the listener closed (actor stopping): nobody to answer
                log.info("%s: dropped the reply to %s (listener closed)", self.actor, self.message_type)
                return
            try:
                _nngio.send(self._ctx, frame)
            except (pynng.Closed, pynng.Timeout):
                log.warning("%s: could not send the reply to %s (caller gone)", self.actor, self.message_type)
            finally:
                _nngio.close_quietly(self._ctx)
        finally:
            if self._on_reply is not None:  # the resent copies of this request get the same answer
                self._on_reply(frame)


class _Delivery:
    __slots__ = ("msg", "pending")

    def __init__(self, msg: Any, pending: Pending | None):
        self.msg = msg
        self.pending = pending


class _Call:
    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], None]):
        self.fn = fn


class _Scheduler:
    """One thread per process that runs timers (``Actor.call_later``). It never ends: it
    naps at most ``NAP_S`` at a time (a far deadline cannot overflow a wait), and a timer
    that raises is logged and the next one runs."""

    NAP_S = 3600.0

    def __init__(self):
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cond = threading.Condition()
        self._seq = 0
        self._thread: threading.Thread | None = None

    def call_at(self, when: float, fn: Callable[[], None]) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (when, self._seq, fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="asyncflow-timers", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else min(self._heap[0][0] - time.monotonic(), self.NAP_S))
                _, _, fn = heapq.heappop(self._heap)
            try:
                fn()
            except pykka.ActorDeadError:
                pass  # the actor stopped before its timer fired
            except Exception:  # the thread serves every actor of the process: one timer never ends it
                log.exception("a timer failed")


_scheduler = _Scheduler()


class ActorContext:
    """What an actor knows of its place: name, address, transport, directory."""

    def __init__(self, name: str, transport: TransportConfig, directory_address: str | None = None):
        self.name = name
        self.address = ""  # filled in once the listener is bound
        self.transport = transport
        self.directory_address = directory_address
        self.num_rejected_frames = 0  # counted by the listener
        self.actor: Actor | None = None
        self._directory = None

    @property
    def directory(self):
        if self._directory is None:
            if self.directory_address is None:
                raise RuntimeError(f"actor {self.name!r} was started without a directory address")
            self._directory = DirectoryClient(self.directory_address, self.transport)
        return self._directory

    def ref(self, name: str, wait_s: float = 10.0):
        """A reference to the actor registered as ``name`` (waits for it to appear)."""
        return self.directory.ref(name, wait_s=wait_s)


class Actor(pykka.ThreadingActor):
    """Base of every asyncflow actor. Subclasses set ``Inbox`` and implement ``handle``."""

    Inbox: ClassVar[Any] = None
    Urgent: ClassVar[tuple[type, ...]] = ()
    """Message types handled by ``handle_urgent`` on the listener thread, without
    waiting behind the message in progress (notifications such as WeightsReady
    that must not wait for a long unit of work). Thread safety is the actor's."""

    Heralded: ClassVar[tuple[type, ...]] = ()
    """Message types of which ``on_arrival`` hears on the listener thread as they arrive,
    before they queue for ``handle`` (a Pause that must cut short a wait in progress)."""

    Control: ClassVar[bool] = False
    """A control actor (directory, process host) takes only small messages: its listener
    receives frames of up to ``control_max_message_bytes`` instead of ``max_message_bytes``."""

    def handle_urgent(self, msg: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} lists {type(msg).__name__} in Urgent but has no handle_urgent")

    def on_arrival(self, msg: Any) -> None:
        """A ``Heralded`` message arrived (listener thread; it is handled later, in order)."""

    def __init__(self, ctx: ActorContext):
        super().__init__()
        self.ctx = ctx
        ctx.actor = self  # the listener hands Urgent messages to it directly

    # -- to implement ------------------------------------------------------------
    def handle(self, msg: Any, pending: Pending | None) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement handle()")

    # -- helpers -----------------------------------------------------------------
    def call_later(self, delay_s: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` in this actor's thread after ``delay_s`` seconds (at most
        ``protocol.MAX_WAIT_S``: a message's waits are bounded by its schema, a config's by
        its keys' ranges; anything else is a ValueError here, not a stopped timer)."""
        if not 0 <= delay_s <= protocol.MAX_WAIT_S:  # NaN too
            raise ValueError(f"{self.ctx.name}: a timer of {delay_s} s: use 0 to {protocol.MAX_WAIT_S:g} s")
        ref = self.actor_ref
        _scheduler.call_at(time.monotonic() + delay_s, lambda: ref.tell(_Call(fn)))

    # -- pykka -------------------------------------------------------------------
    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Call):
            message.fn()
            return None
        if not isinstance(message, _Delivery):
            return self.handle(message, None)  # in-process pykka use (tests, local helpers)
        msg, pending = message.msg, message.pending
        try:
            if isinstance(msg, protocol.Ping):
                result = protocol.Pong(
                    name=self.ctx.name,
                    pid=os.getpid(),
                    host=socket.gethostname(),
                    num_rejected_frames=self.ctx.num_rejected_frames,
                )
            else:
                result = self.handle(msg, pending)
        except Exception as exc:
            if pending is not None and not pending.done:
                log.warning("actor %s failed on %s: %s", self.ctx.name, type(msg).__name__, exc)
                pending.reject(exc)
            else:
                log.error("actor %s failed on told %s:\n%s", self.ctx.name, type(msg).__name__, traceback.format_exc())
            return None
        if pending is not None and result is not DEFER and not pending.done:
            pending.resolve(result)
        return None


class _Listener:
    """The receive thread of one actor: frames in, deliveries to the pykka inbox."""

    def __init__(self, actor_cls: type[Actor], ctx: ActorContext, pykka_ref: pykka.ActorRef, address: str):
        self._name = ctx.name
        self._ctx = ctx
        self._pykka_ref = pykka_ref
        self._decoder = frames.decoder_for(actor_cls.Inbox)
        self._urgent = actor_cls.Urgent
        self._heralded = actor_cls.Heralded
        self._secret = ctx.transport.secret_bytes()
        limit = ctx.transport.control_max_message_bytes if actor_cls.Control else ctx.transport.max_message_bytes
        self._sock, self.address = listen(address, ctx.transport, limit)
        self._check_secret = is_tcp(self.address)
        self._closed = False
        self._next_reject_log = 0.0
        self.replay = ReplayCache()  # resendable requests: served once, every copy answered alike
        self._thread = threading.Thread(target=self._run, name=f"listen-{self._name}", daemon=True)
        self._thread.start()

    def _reject(self, ctx: pynng.Context, error_type: str, error: str) -> None:
        self._ctx.num_rejected_frames += 1
        now = time.monotonic()
        if now >= self._next_reject_log:  # a flood of bad frames logs once per interval
            log.warning(
                "actor %s rejected a frame (%s; %d rejected so far): %s",
                self._name,
                error_type,
                self._ctx.num_rejected_frames,
                error,
            )
            self._next_reject_log = now + REJECT_LOG_INTERVAL_S
        try:
            _nngio.send(ctx, frames.error_reply(error_type, error))
        except (pynng.Closed, pynng.Timeout):
            pass
        _nngio.close_quietly(ctx)

    def _run(self) -> None:
        while not self._closed:
            ctx = None
            try:
                ctx = _nngio.new_context(self._sock)
                frame = _nngio.recv(ctx)
            except pynng.Closed:
                if ctx is not None:
                    _nngio.close_quietly(ctx)
                return
            try:
                self._serve(ctx, frame)
            except Exception as exc:  # the containment boundary: one frame never ends the listener
                self._reject(ctx, "rejected", f"actor {self._name!r} failed on a frame: {type(exc).__name__}: {exc}")

    def _serve(self, ctx: pynng.Context, frame: memoryview) -> None:
        try:
            head_view, body_view = frames.split_frame(frame)
        except FrameError as exc:
            self._reject(ctx, "rejected", f"actor {self._name!r}: {exc}")
            return
        if self._check_secret:  # before the header is decoded: an unauthenticated peer gets no parser
            secret = frames.peek_secret(head_view)
            if secret is None or not hmac.compare_digest(secret, self._secret):
                self._reject(ctx, "auth", f"actor {self._name!r} refused the request: wrong or missing cluster secret")
                return
        try:
            header = frames.decode_header(head_view)
        except FrameError as exc:
            self._reject(ctx, "rejected", f"actor {self._name!r}: {exc}")
            return
        if header.target != self._name:
            self._reject(ctx, "unknown_actor", f"this address serves {self._name!r}, not {header.target!r}")
            return
        try:
            msg = frames.decode_body(self._decoder, body_view)
        except FrameError as exc:
            self._reject(ctx, "rejected", f"actor {self._name!r} {exc}")
            return
        on_reply: ReplyHook | None = None
        if header.sender:  # a resendable request: one copy is served, each gets its answer
            what, answer = self.replay.begin(header.sender, header.seq, ctx)
            if what != NEW:
                if what == ANSWERED:
                    assert answer is not None  # an answered request keeps its frame
                    self._send_and_close(ctx, answer)
                elif what == STALE:
                    self._send_and_close(ctx, frames.error_reply("stale", f"a newer request of {header.sender} came first"))
                return  # WAITING: ``ctx`` gets the answer with the first copy
            sender, seq = header.sender, header.seq
            on_reply = lambda frame: self._answer_copies(sender, seq, frame)  # noqa: E731
            try:
                self._deliver(ctx, header, msg, on_reply)
            except Exception as exc:  # contained as in _run, and the copies waiting get the same error
                error = frames.error_reply("rejected", f"actor {self._name!r} failed on a frame: {type(exc).__name__}: {exc}")
                self._send_and_close(ctx, error)
                on_reply(error)
            return
        self._deliver(ctx, header, msg, None)

    def _deliver(self, ctx: pynng.Context, header: protocol.Header, msg: Any, on_reply: ReplyHook | None) -> None:
        """Serve a decoded request: at once on this thread (Urgent), or through the actor's inbox."""
        if self._urgent and isinstance(msg, self._urgent):
            self._serve_urgent(ctx, msg, on_reply)
            return
        if self._heralded and isinstance(msg, self._heralded):
            actor = self._ctx.actor
            if actor is not None:
                try:
                    actor.on_arrival(msg)
                except Exception as exc:  # a herald is a hint: the message is still handled
                    log.warning("actor %s failed on the arrival of %s: %s", self._name, type(msg).__name__, exc)
        if header.kind == protocol.TELL:
            pending = None
            ok = frames.ok_reply()
            self._send_and_close(ctx, ok)
            if on_reply is not None:
                on_reply(ok)
        else:
            pending = Pending(ctx, self._name, type(msg).__name__, on_reply)
        try:
            self._pykka_ref.tell(_Delivery(msg, pending))
        except pykka.ActorDeadError:
            if pending is not None:
                pending._send(frames.error_reply("remote", f"actor {self._name!r} has stopped"))

    def _serve_urgent(self, ctx: pynng.Context, msg: Any, on_reply: ReplyHook | None = None) -> None:
        try:
            actor = self._ctx.actor
            assert actor is not None  # set before the listener serves
            reply = frames.ok_reply(actor.handle_urgent(msg))
        except Exception as exc:
            log.warning("actor %s failed on urgent %s: %s", self._name, type(msg).__name__, exc)
            reply = frames.error_reply("remote", f"{type(exc).__name__}: {exc}")
        self._send_and_close(ctx, reply)
        if on_reply is not None:
            on_reply(reply)

    @staticmethod
    def _send_and_close(ctx: pynng.Context, frame: bytes | bytearray) -> None:
        try:
            _nngio.send(ctx, frame)
        except (pynng.Closed, pynng.Timeout):
            pass
        _nngio.close_quietly(ctx)

    def _answer_copies(self, sender: str, seq: int, frame: bytearray) -> None:
        """The copies of request ``(sender, seq)`` that came while it was served get its answer."""
        for ctx in self.replay.answered(sender, seq, frame):
            self._send_and_close(ctx, frame)

    def close(self) -> None:
        self._closed = True
        _nngio.close_socket(self._sock)
        self._thread.join(timeout=5)


class ServedActor:
    """A running actor and its listener, in this process."""

    def __init__(self, name: str, address: str, kind: str, pykka_ref: pykka.ActorRef, listener: _Listener):
        self.name = name
        self.address = address
        self.kind = kind
        self.pykka_ref = pykka_ref
        self._listener = listener

    @property
    def num_rejected_frames(self) -> int:
        return self._listener._ctx.num_rejected_frames

    @property
    def num_replayed(self) -> int:
        """Copies of resent requests answered with the first copy's answer (``core/replay.py``)."""
        return self._listener.replay.num_replayed

    def entry(self) -> protocol.ActorEntry:
        return protocol.ActorEntry(
            name=self.name, address=self.address, host=socket.gethostname(), pid=os.getpid(), kind=self.kind
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        self._listener.close()
        try:
            self.pykka_ref.stop(timeout=timeout_s)
        except pykka.ActorDeadError:
            pass


def serve_actor(
    actor_cls: type[Actor],
    name: str,
    transport: TransportConfig,
    address: str | None = None,
    directory_address: str | None = None,
    **kwargs: Any,
) -> ServedActor:
    """Start ``actor_cls(ctx, **kwargs)`` and a listener for it; returns once both run."""
    from asyncflow.core.transport import new_address

    if actor_cls.Inbox is None:
        raise TypeError(f"{actor_cls.__name__}.Inbox is not set: name the union of messages it accepts")
    ctx = ActorContext(name, transport.validate(), directory_address)
    pykka_ref = actor_cls.start(ctx, **kwargs)
    try:
        listener = _Listener(actor_cls, ctx, pykka_ref, address or new_address(transport, name))
    except BaseException:
        pykka_ref.stop()
        raise
    ctx.address = listener.address
    return ServedActor(name, listener.address, f"{actor_cls.__module__}:{actor_cls.__name__}", pykka_ref, listener)
