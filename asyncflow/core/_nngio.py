"""Send and receive nng messages with as few copies as pynng allows.

- ``send``: the frame (a bytearray) is appended into a fresh nng message straight
  from its buffer (one copy, no intermediate ``bytes``).
- ``recv``: returns a read-only memoryview over the nng message body itself (no
  copy). The view keeps the nng message alive: a small ndarray subclass holds the
  pynng ``Message`` so the body is freed only when the last view is gone.
"""

from __future__ import annotations

import numpy as np
import pynng
from pynng import ffi, lib


class _MessageBytes(np.ndarray):
    """uint8 view of an nng message body that owns the message."""

    _message: pynng.Message


def send(ctx: pynng.Context, frame: bytearray | bytes) -> None:
    ctx.send_msg(pynng.Message(ffi.from_buffer(frame)))


def recv(ctx: pynng.Context) -> memoryview:
    msg = ctx.recv_msg()
    size = lib.nng_msg_len(msg._nng_msg)
    if size == 0:
        return memoryview(b"")
    body = ffi.buffer(ffi.cast("char *", lib.nng_msg_body(msg._nng_msg)), size)
    arr = np.frombuffer(body, dtype=np.uint8).view(_MessageBytes)
    arr._message = msg
    arr.flags.writeable = False
    return memoryview(arr)


def close_quietly(ctx: pynng.Context) -> None:
    """Close a context whose socket may already be closed (no noise at GC time)."""
    try:
        ctx.close()
    except pynng.Closed:
        ctx._context = None
