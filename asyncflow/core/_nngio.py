"""Send and receive nng messages with as few copies as pynng allows.

- ``send``: the frame (a bytearray) is appended into a fresh nng message straight
  from its buffer (one copy, no intermediate ``bytes``).
- ``recv``: returns a read-only memoryview over the nng message body itself (no
  copy). The view keeps the nng message alive: a small ndarray subclass holds the
  pynng ``Message`` so the body is freed only when the last view is gone.

Invariant: a send never runs concurrently with the close of its socket. nng aborts
the process ("pthread_mutex_lock: Invalid argument") when a reply is sent on a
context whose socket is being closed, which happened when an actor stopped while
another thread answered a request. Sends and ``close_socket`` take the socket's
lock; a send after the close raises ``pynng.Closed``.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pynng
from pynng import ffi, lib

log = logging.getLogger(__name__)

_contexts: dict[int, set] = {}  # id(socket) -> its open contexts (strong refs: see close_socket)
_locks: dict[int, threading.RLock] = {}  # id(socket) -> held by sends and by its close
_contexts_lock = threading.Lock()
_ECLOSED = 7  # NNG_ECLOSED


class _MessageBytes(np.ndarray):
    """uint8 view of an nng message body that owns the message."""

    _message: pynng.Message


def send(ctx: pynng.Context, frame: bytearray | bytes) -> None:
    owner = getattr(ctx, "_af_socket", None)
    if owner is None:  # a context not made by new_context
        ctx.send_msg(pynng.Message(ffi.from_buffer(frame)))
        return
    lock = _locks.get(owner)
    if lock is None:
        raise pynng.Closed("the socket of this context is closed", _ECLOSED)
    with lock:
        if ctx._context is None:
            raise pynng.Closed("the socket of this context is closed", _ECLOSED)
        ctx.send_msg(pynng.Message(ffi.from_buffer(frame)))


def recv(ctx: pynng.Context) -> memoryview:
    try:
        msg = ctx.recv_msg()
    except TypeError:
        # the socket was closed (actor stopping) between making this context and receiving
        # on it: pynng has set its handle to None. Say so as nng would.
        if ctx._context is None:
            raise pynng.Closed("the socket of this context is closed", _ECLOSED) from None
        raise
    size = lib.nng_msg_len(msg._nng_msg)
    if size == 0:
        return memoryview(b"")
    body = ffi.buffer(ffi.cast("char *", lib.nng_msg_body(msg._nng_msg)), size)
    arr = np.frombuffer(body, dtype=np.uint8).view(_MessageBytes)
    arr._message = msg
    arr.flags.writeable = False
    return memoryview(arr)  # type: ignore[arg-type]  # ndarray is a buffer; numpy's stubs lack __buffer__


def new_context(sock: pynng.Socket) -> pynng.Context:
    """A context of ``sock``, remembered so ``close_socket`` can close it first."""
    ctx = sock.new_context()
    ctx._af_socket = id(sock)
    with _contexts_lock:
        _contexts.setdefault(id(sock), set()).add(ctx)
        _locks.setdefault(id(sock), threading.RLock())
    return ctx


def close_socket(sock: pynng.Socket) -> None:
    """Close the socket's open contexts, then the socket.

    Contexts are held by strong references until closed here or by ``close_quietly``,
    so pynng's finaliser never runs on an open context (it raced with explicit
    closes from other threads and printed errors at garbage collection)."""
    lock = _locks.get(id(sock)) or threading.RLock()
    with lock:  # waits for a send in progress; later sends see closed contexts
        with _contexts_lock:
            ctxs = list(_contexts.pop(id(sock), ()))
        for ctx in ctxs:
            close_quietly(ctx)
        _close_bounded(sock)
    with _contexts_lock:
        _locks.pop(id(sock), None)


CLOSE_WAIT_S = 10.0
"""How long ``close_socket`` waits for nng_close. nng_close can deadlock inside nng
(nanomsg/nng #1813, #1236): it hung a test's actor stop for minutes under load, where
no timeout could interrupt it. Past this wait the close is left to a daemon thread, the
socket is given up (its contexts are closed, sends raise Closed) and the caller goes on."""


def _close_bounded(sock: pynng.Socket) -> None:
    closer = threading.Thread(target=sock.close, name="nng-close", daemon=True)
    closer.start()
    closer.join(CLOSE_WAIT_S)
    if closer.is_alive():
        log.warning(
            "nng_close did not return within %.0f s (an nng deadlock): the socket is left to close in the background",
            CLOSE_WAIT_S,
        )


def close_quietly(ctx: pynng.Context) -> None:
    """Close a context once, whoever calls first; later calls do nothing."""
    owner: int = getattr(ctx, "_af_socket", -1)  # id() of its socket, set where it was opened; -1: none
    lock = _locks.get(owner) or threading.RLock()
    with lock, _contexts_lock:  # lock order: the socket's, then the registry's
        owned = _contexts.get(owner)
        if owned is not None:
            owned.discard(ctx)
        if ctx._context is None:
            return
        try:
            ctx.close()
        except pynng.Closed:
            pass
        ctx._context = None
