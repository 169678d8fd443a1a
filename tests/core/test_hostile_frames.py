"""Hostile frames and abrupt lifecycles against live listeners."""

from __future__ import annotations

import random
import threading

import pynng
import pytest

from asyncflow.core import frames, protocol
from asyncflow.core.actor import serve_actor
from asyncflow.core.echo import EchoActor
from asyncflow.core.ref import ActorRef
from asyncflow.core.transport import TransportConfig

DEPTH = 5000


def _deep(depth: int = DEPTH) -> bytes:
    """A msgpack value nested ``depth`` arrays deep (each a one-element fixarray)."""
    return b"\x91" * depth + b"\x90"


def _hostile_frames(secret: bytes) -> list[tuple[str, bytes]]:
    header = protocol.Header(target="echo", kind=protocol.ASK, secret=secret)
    good = bytes(frames.encode_frame(header, protocol.Echo(payload=b"x" * 40)))
    head_len = int.from_bytes(good[:4], "little")
    good_head = good[4 : 4 + head_len]

    def frame(head: bytes, body: bytes = b"\xc0") -> bytes:
        return len(head).to_bytes(4, "little") + head + body

    # the header array with a fifth element nested deep (msgspec skips extra elements)
    deep_tail = frame(b"\x95" + good_head[1:] + _deep())
    deep_no_secret = frame(b"\x95" + bytes(frames.encode_frame(protocol.Header(target="echo", kind=protocol.ASK))[5:]) + _deep())
    rng = random.Random(11)
    out = [
        ("header nested deep, with the secret", deep_tail),
        ("header nested deep, without the secret", deep_no_secret),
        ("header that is a deep array", frame(_deep())),
        ("body nested deep", frame(good_head, _deep())),
        ("empty", b""),
        ("three bytes", b"\x01\x00\x00"),
        ("header length past the end", (1 << 31).to_bytes(4, "little") + good[4:]),
        ("header of wrong types", frame(b"\x94\x01\xa3abc\xc3\xc0")),
        ("header a map", frame(b"\x81\xa1a\x01")),
        ("secret as a str", frame(b"\x94\xa4echo\x01\xa2xy\x00")),
    ]
    for cut in (1, 5, len(good) // 2, len(good) - 1):
        out.append((f"truncated at {cut}", good[:cut]))
    for k in range(40):
        flipped = bytearray(good)
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        out.append((f"bit flip {k}", bytes(flipped)))
    return out


@pytest.fixture(params=["ipc", "tcp"])
def echo(request, tmp_path):
    transport = TransportConfig(scheme=request.param, secret="test-secret", ipc_dir=str(tmp_path))
    actor = serve_actor(EchoActor, "echo", transport)
    yield actor, transport
    actor.stop()


@pytest.mark.timeout(60)
def test_hostile_frames_are_rejected_and_counted_and_the_actor_still_answers(echo):
    actor, transport = echo
    secret = transport.secret_bytes()
    hostile = _hostile_frames(secret)
    num_answered = 0
    with pynng.Req0(recv_timeout=3000, send_timeout=3000, recv_max_size=1 << 20) as raw:
        raw.dial(actor.address, block=True)
        for what, frame in hostile:
            raw.send(frame)
            head, _ = frames.split_frame(raw.recv())  # a dead listener times out here
            num_answered += 1
            reply = frames.decode_reply_header(head)
            assert reply.ok or reply.error_type in ("rejected", "auth", "unknown_actor"), (what, reply)
    assert num_answered == len(hostile)
    ref = ActorRef("echo", actor.address, transport)
    assert ref.ask(protocol.Echo(payload=b"alive"), timeout_s=5).payload == b"alive"
    pong = ref.ask(protocol.Ping(), timeout_s=5)
    num_ok_flips = len(hostile) - pong.num_rejected_frames  # a flip in the payload is still a valid Echo
    assert 0 <= num_ok_flips <= 40
    assert actor.num_rejected_frames >= 14


@pytest.mark.timeout(30)
def test_a_tcp_frame_without_the_secret_is_refused_before_its_header_is_decoded(monkeypatch):
    transport = TransportConfig(scheme="tcp", secret="right")
    actor = serve_actor(EchoActor, "echo", transport)
    decoded = []
    real = frames.decode_header
    monkeypatch.setattr(frames, "decode_header", lambda view: decoded.append(1) or real(view))
    try:
        intruder = bytes(frames.encode_frame(protocol.Header(target="echo", kind=protocol.ASK, secret=b"wrong")))
        with pynng.Req0(recv_timeout=3000, send_timeout=3000) as raw:
            raw.dial(actor.address, block=True)
            raw.send(intruder)
            head, _ = frames.split_frame(raw.recv())
        assert frames.decode_reply_header(head).error_type == "auth"
        assert decoded == []
    finally:
        actor.stop()


@pytest.mark.timeout(30)
def test_any_exception_while_serving_a_frame_is_contained_and_counted(monkeypatch, tmp_path):
    actor = serve_actor(EchoActor, "echo", TransportConfig(scheme="ipc", ipc_dir=str(tmp_path)))
    ref = ActorRef("echo", actor.address, actor._listener._ctx.transport)
    real = frames.decode_body
    calls = []

    def fails_once(decoder, view):
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("no room for this frame")
        return real(decoder, view)

    monkeypatch.setattr(frames, "decode_body", fails_once)
    try:
        with pytest.raises(Exception, match="failed on a frame: MemoryError: no room for this frame"):
            ref.ask(protocol.Echo(payload=b"first"), timeout_s=5)
        assert ref.ask(protocol.Echo(payload=b"second"), timeout_s=5).payload == b"second"
        assert actor.num_rejected_frames == 1
    finally:
        actor.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scheme", ["inproc", "ipc"])
def test_an_actor_stopped_right_after_it_started_leaves_no_thread_exception(scheme, tmp_path, monkeypatch):
    raised = []
    monkeypatch.setattr(
        threading, "excepthook", lambda args: raised.append(f"{args.thread.name}: {args.exc_type.__name__}: {args.exc_value}")
    )
    transport = TransportConfig(scheme=scheme, ipc_dir=str(tmp_path))
    for _ in range(50):
        actor = serve_actor(EchoActor, "echo", transport)
        actor.stop()
        actor._listener._thread.join(timeout=5)
        assert not actor._listener._thread.is_alive()
    assert raised == []
