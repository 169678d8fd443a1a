"""Frame encoding: ``[u32 header length][header][body]`` in one buffer.

The body is encoded straight after the header with ``encode_into`` so a large
tensor payload is copied once into the frame; decoding yields memoryviews into the
received frame (no copy). Encoders and decoders are built once per process.

Every decoder here turns any malformed input (bad msgpack, a wrong schema, values
nested so deep that msgspec raises ``RecursionError``) into ``FrameError``.
The request header is the msgpack array ``[target, kind, secret, timeout_s, sender, seq]``:
``peek_secret`` reads the secret from that fixed prefix without decoding anything
else, so a listener refuses an unauthenticated frame before it parses the rest.
"""

from __future__ import annotations

import functools
import struct
import time
from typing import Any, Union

import msgspec

from asyncflow.core import protocol
from asyncflow.core.errors import FrameError

_LEN = struct.Struct("<I")
_ENCODER = msgspec.msgpack.Encoder()
_HEADER_DECODER = msgspec.msgpack.Decoder(protocol.Header)
_REPLY_HEADER_DECODER = msgspec.msgpack.Decoder(protocol.ReplyHeader)
_NONE = _ENCODER.encode(None)
_MALFORMED = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def encode_frame(header: msgspec.Struct, body: Any = None) -> bytearray:
    buf = bytearray(_LEN.size)
    _ENCODER.encode_into(header, buf, _LEN.size)
    _LEN.pack_into(buf, 0, len(buf) - _LEN.size)
    _ENCODER.encode_into(body, buf, -1)
    return buf


def split_frame(frame: bytes | memoryview) -> tuple[memoryview, memoryview]:
    view = memoryview(frame)
    if len(view) < _LEN.size:
        raise FrameError(f"frame of {len(view)} bytes is shorter than its length prefix")
    (header_len,) = _LEN.unpack_from(view, 0)
    end = _LEN.size + header_len
    if end > len(view):
        raise FrameError(f"frame header claims {header_len} bytes, frame has {len(view) - _LEN.size}")
    return view[_LEN.size : end], view[end:]


def decode_header(view: memoryview) -> protocol.Header:
    try:
        return _HEADER_DECODER.decode(view)
    except _MALFORMED as exc:
        raise FrameError(f"bad request header: {exc}") from None


def _msgpack_length(view: memoryview, pos: int, fixed: tuple[int, int], sized: dict[int, int]) -> tuple[int, int] | None:
    """(length, position after the type prefix) of a msgpack str/bin/array at ``pos``;
    None when the byte there is none of the ``fixed`` range or ``sized`` codes."""
    if pos >= len(view):
        return None
    code = view[pos]
    if fixed[0] <= code <= fixed[1]:
        return code - fixed[0], pos + 1
    width = sized.get(code)
    if width is None or pos + 1 + width > len(view):
        return None
    return int.from_bytes(view[pos + 1 : pos + 1 + width], "big"), pos + 1 + width


_ARRAY = ((0x90, 0x9F), {0xDC: 2, 0xDD: 4})
_STR = ((0xA0, 0xBF), {0xD9: 1, 0xDA: 2, 0xDB: 4})
_BIN = ((1, 0), {0xC4: 1, 0xC5: 2, 0xC6: 4})  # no fixed form
_INT_WIDTH = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}


def peek_secret(view: memoryview) -> bytes | None:
    """The ``secret`` of a request header, read from its fixed prefix (array head,
    ``target`` str, ``kind`` int, ``secret`` bin) without decoding the rest; None
    when the header does not start that way (the frame is then refused as unauthenticated)."""
    array = _msgpack_length(view, 0, *_ARRAY)
    if array is None or array[0] < 3:
        return None
    target = _msgpack_length(view, array[1], *_STR)
    if target is None:
        return None
    pos = target[1] + target[0]
    if pos >= len(view):
        return None
    code = view[pos]
    if code <= 0x7F or code >= 0xE0:  # positive or negative fixint
        pos += 1
    elif code in _INT_WIDTH:
        pos += 1 + _INT_WIDTH[code]
    else:
        return None
    secret = _msgpack_length(view, pos, *_BIN)
    if secret is None or secret[1] + secret[0] > len(view):
        return None
    return bytes(view[secret[1] : secret[1] + secret[0]])


def decode_body(decoder: msgspec.msgpack.Decoder, view: memoryview) -> Any:
    """Decode a request body with an actor's inbox decoder."""
    try:
        return decoder.decode(view)
    except _MALFORMED as exc:
        raise FrameError(f"cannot decode the message: {exc}") from None


def decode_reply_header(view: memoryview) -> protocol.ReplyHeader:
    try:
        return _REPLY_HEADER_DECODER.decode(view)
    except _MALFORMED as exc:
        raise FrameError(f"bad reply header: {exc}") from None


def _all_messages(cls: type) -> list[type]:
    out: list[type] = []
    subclasses: list[type] = cls.__subclasses__()
    for sub in subclasses:
        out.append(sub)
        out.extend(_all_messages(sub))
    return out


@functools.cache
def decoder_for(union: Any) -> msgspec.msgpack.Decoder:
    """The decoder of one actor's inbox union, built once."""
    return msgspec.msgpack.Decoder(union)


@functools.lru_cache(maxsize=2)
def _any_message_decoder(generation: int) -> msgspec.msgpack.Decoder:
    """Every message class defined when ``protocol.generation()`` was ``generation``."""
    return msgspec.msgpack.Decoder(Union[tuple(_all_messages(protocol._Msg))] | None)  # noqa: UP007  (a union of a run-time tuple)


HALF_DEFINED_WAIT_S = 10.0
"""How long a decode waits for a message class another thread is defining right now."""


def _any_decoder() -> msgspec.msgpack.Decoder:
    """``_any_message_decoder`` of the classes defined so far. A class another thread is
    defining right now (its module being imported) is already a subclass but not yet usable
    in a decoder: msgspec refuses it ("isn't fully defined"); the class is finished in
    moments, so the decoder is built again until it is."""
    deadline = time.monotonic() + HALF_DEFINED_WAIT_S
    while True:
        try:
            return _any_message_decoder(protocol.generation())
        except ValueError as exc:
            if "fully defined" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.001)  # let the defining thread finish the class


def decode_any(view: memoryview) -> Any:
    """Decode a reply body: any message class defined so far (core's, and those of the
    modules imported since, the RL roles'), or None."""
    try:
        return _any_decoder().decode(view)
    except _MALFORMED as exc:
        raise FrameError(f"bad reply body: {exc}") from None


def ok_reply(body: Any = None) -> bytearray:
    return encode_frame(protocol.ReplyHeader(ok=True), body)


def error_reply(error_type: str, error: str) -> bytearray:
    return encode_frame(protocol.ReplyHeader(ok=False, error_type=error_type, error=error))
