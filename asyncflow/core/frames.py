"""Frame encoding: ``[u32 header length][header][body]`` in one buffer.

The body is encoded straight after the header with ``encode_into`` so a large
tensor payload is copied once into the frame; decoding yields memoryviews into the
received frame (no copy). Encoders and decoders are built once per process.
"""

from __future__ import annotations

import functools
import struct
from typing import Any, Union

import msgspec

from asyncflow.core import protocol
from asyncflow.core.errors import FrameError

_LEN = struct.Struct("<I")
_ENCODER = msgspec.msgpack.Encoder()
_HEADER_DECODER = msgspec.msgpack.Decoder(protocol.Header)
_REPLY_HEADER_DECODER = msgspec.msgpack.Decoder(protocol.ReplyHeader)
_NONE = _ENCODER.encode(None)


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
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FrameError(f"bad request header: {exc}") from None


def decode_reply_header(view: memoryview) -> protocol.ReplyHeader:
    try:
        return _REPLY_HEADER_DECODER.decode(view)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FrameError(f"bad reply header: {exc}") from None


def _all_messages(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_messages(sub))
    return out


@functools.cache
def decoder_for(union: Any) -> msgspec.msgpack.Decoder:
    """The decoder of one actor's inbox union, built once."""
    return msgspec.msgpack.Decoder(union)


@functools.cache
def _any_message_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(Union[tuple(_all_messages(protocol._Msg))] | None)


def decode_any(view: memoryview) -> Any:
    """Decode a reply body: any protocol message, or None."""
    try:
        return _any_message_decoder().decode(view)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FrameError(f"bad reply body: {exc}") from None


def ok_reply(body: Any = None) -> bytearray:
    return encode_frame(protocol.ReplyHeader(ok=True), body)


def error_reply(error_type: str, error: str) -> bytearray:
    return encode_frame(protocol.ReplyHeader(ok=False, error_type=error_type, error=error))
