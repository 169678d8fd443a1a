"""The actor runtime over real nng sockets: inproc, ipc and tcp, one process and several."""

from __future__ import annotations

import os
import random

import msgspec
import pynng
import pytest

from asyncflow.core import frames, protocol
from asyncflow.core.actor import serve_actor
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.echo import EchoActor
from asyncflow.core.errors import ActorTimeout, RemoteError, Unauthorized
from asyncflow.core.host import spawn_host
from asyncflow.core.ref import ActorRef
from asyncflow.core.tensors import to_numpy, to_torch, to_wire
from asyncflow.core.transport import TransportConfig

SCHEMES = ["inproc", "ipc", "tcp"]


@pytest.fixture
def echo(request, tmp_path):
    scheme = request.param
    transport = TransportConfig(scheme=scheme, secret="test-secret", ipc_dir=str(tmp_path))
    actor = serve_actor(EchoActor, "echo", transport)
    yield actor, transport
    actor.stop()


def test_messages_round_trip_through_a_frame_unchanged():
    msg = protocol.Register(entry=protocol.ActorEntry(name="a", address="ipc:///x", host="h", pid=3, kind="k"))
    head, body = frames.split_frame(frames.encode_frame(protocol.Header(target="t", kind=protocol.ASK), msg))
    assert frames.decode_header(head).target == "t"
    assert frames.decode_any(body) == msg


def test_tensors_travel_as_raw_bytes_and_come_back_equal():
    import numpy as np
    import torch

    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    wire = to_wire(arr)
    assert wire.shape == (3, 4) and wire.dtype == "float32" and len(bytes(wire.data)) == 48
    encoded = msgspec.msgpack.encode(wire)
    back = msgspec.msgpack.decode(encoded, type=protocol.Tensor)
    assert (to_numpy(back) == arr).all()
    bf16 = torch.randn(5, 7).to(torch.bfloat16)
    back16 = msgspec.msgpack.decode(msgspec.msgpack.encode(to_wire(bf16)), type=protocol.Tensor)
    assert torch.equal(to_torch(back16), bf16)


@pytest.mark.parametrize("echo", SCHEMES, indirect=True)
def test_ask_returns_the_reply_and_tell_is_delivered(echo):
    actor, transport = echo
    ref = ActorRef("echo", actor.address, transport)
    assert ref.ask(protocol.Echo(payload=b"hello")).payload == b"hello"
    ref.tell(protocol.Echo(payload=b"told"))
    pong = ref.ask(protocol.Ping())  # the inbox is FIFO: the tell was handled before this
    assert pong.name == "echo" and pong.pid == os.getpid()
    assert actor.pykka_ref.proxy().num_told.get() == 1


@pytest.mark.parametrize("echo", SCHEMES, indirect=True)
def test_an_exception_in_a_remote_handler_names_the_actor_and_message(echo):
    actor, transport = echo
    ref = ActorRef("echo", actor.address, transport)
    with pytest.raises(RemoteError, match=r"actor 'echo' failed on Echo .*ValueError: boom"):
        ref.ask(protocol.Echo(fail="boom"))
    assert ref.ask(protocol.Echo(payload=b"still serving")).payload == b"still serving"


@pytest.mark.parametrize("echo", ["ipc"], indirect=True)
def test_a_deferred_reply_arrives_after_other_messages_are_served(echo):
    actor, transport = echo
    import threading

    ref = ActorRef("echo", actor.address, transport)
    got = []
    slow = threading.Thread(target=lambda: got.append(ref.ask(protocol.Echo(payload=b"slow", delay_s=0.3))))
    slow.start()
    assert ref.ask(protocol.Echo(payload=b"fast")).payload == b"fast"
    slow.join(timeout=10)
    assert got and got[0].payload == b"slow"


def test_a_dead_peer_gives_a_timeout_naming_it(tmp_path):
    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path))
    ref = ActorRef("ghost", f"ipc://{tmp_path}/nobody.sock", transport)
    with pytest.raises(ActorTimeout, match=r"actor 'ghost' at ipc://.*nobody.sock did not answer Ping within 0.3 s"):
        ref.ask(protocol.Ping(), timeout_s=0.3)


def test_a_tcp_peer_without_the_secret_is_refused():
    transport = TransportConfig(scheme="tcp", secret="right")
    actor = serve_actor(EchoActor, "echo", transport)
    try:
        intruder = ActorRef("echo", actor.address, TransportConfig(scheme="tcp", secret="wrong"))
        with pytest.raises(Unauthorized, match="wrong or missing cluster secret"):
            intruder.ask(protocol.Ping())
        anonymous = ActorRef("echo", actor.address, TransportConfig(scheme="tcp", secret=""))
        with pytest.raises(Unauthorized):
            anonymous.ask(protocol.Ping())
        assert ActorRef("echo", actor.address, transport).ask(protocol.Ping()).num_rejected_frames == 2
    finally:
        actor.stop()


def test_binding_a_public_address_without_a_secret_is_refused(monkeypatch):
    monkeypatch.delenv("ASYNCFLOW_SECRET", raising=False)
    with pytest.raises(
        ValueError, match=r"bind_host = '0.0.0.0' is not loopback: set \[cluster.transport\] tls_dir .*or a secret"
    ):
        serve_actor(EchoActor, "echo", TransportConfig(scheme="tcp", bind_host="0.0.0.0"))


def _malformed_frames(n: int, rng: random.Random, secret: bytes) -> list[bytes]:
    """Random bytes, truncated frames, a valid header with a body of the wrong schema,
    and frames with a corrupted length and a flipped byte (all with the right secret)."""
    header = protocol.Header(target="echo", kind=protocol.ASK, secret=secret)
    good = bytes(frames.encode_frame(header, protocol.Echo(payload=b"x" * 40)))
    wrong_schema = bytes(frames.encode_frame(header, protocol.Lookup(name="x")))
    out = []
    for i in range(n):
        match i % 4:
            case 0:
                out.append(rng.randbytes(rng.randrange(0, 200)))
            case 1:
                out.append(good[: rng.randrange(0, len(good) - 1)])
            case 2:
                out.append(wrong_schema)
            case 3:
                frame = bytearray(good)
                frame[rng.randrange(4, len(frame))] ^= 0xFF
                frame[0:4] = (rng.randrange(0, 1 << 32)).to_bytes(4, "little")
                out.append(bytes(frame))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("echo", SCHEMES, indirect=True)
def test_a_fuzz_of_malformed_frames_is_rejected_and_counted_and_the_actor_keeps_serving(echo):
    actor, transport = echo
    secret = transport.secret_bytes() if actor.address.startswith("tcp") else b""
    frames_ = _malformed_frames(1000, random.Random(7), secret)
    with pynng.Req0(recv_timeout=5000, send_timeout=5000, recv_max_size=1 << 20) as raw:
        raw.dial(actor.address, block=True)
        num_error_replies = 0
        for frame in frames_:
            raw.send(frame)
            head, _ = frames.split_frame(raw.recv())
            num_error_replies += not frames.decode_reply_header(head).ok
    assert num_error_replies == 1000
    ref = ActorRef("echo", actor.address, transport)
    assert ref.ask(protocol.Echo(payload=b"alive")).payload == b"alive"
    assert ref.ask(protocol.Ping()).num_rejected_frames == 1000


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scheme", ["ipc", "tcp"])
def test_actors_in_another_process_are_found_by_name_and_answer(scheme, tmp_path):
    transport = TransportConfig(scheme=scheme, secret="s", ipc_dir=str(tmp_path))
    directory = start_directory(transport)
    client = DirectoryClient(directory.address, transport)
    host = spawn_host("h", client, transport, [protocol.ActorSpec(name="remote-echo", cls="asyncflow.core.echo:EchoActor")])
    try:
        ref = client.ref("remote-echo")
        assert ref.ask(protocol.Ping()).pid == host.pid != os.getpid()
        ref.tell(protocol.Echo(payload=b"one-way"))
        assert ref.ask(protocol.Echo(payload=b"x" * (3 << 20))).payload == b"x" * (3 << 20)
        assert {e.name for e in client.list()} == {"host.h", "remote-echo"}
    finally:
        host.stop()
        assert not host.alive()
        assert client.list() == []
        directory.stop()


def test_a_lookup_of_an_unknown_name_says_so(tmp_path):
    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path))
    directory = start_directory(transport)
    try:
        with pytest.raises(LookupError, match="no actor named 'nope' registered within 0.2 s"):
            DirectoryClient(directory.address, transport).lookup("nope", wait_s=0.2)
    finally:
        directory.stop()


@pytest.mark.timeout(10)
def test_receiving_on_a_context_whose_socket_closed_meanwhile_says_closed():
    """A listener that made a fresh context just before its actor stopped must see
    Closed (and exit its loop), not a TypeError from pynng's cleared handle."""
    from asyncflow.core import _nngio

    sock = pynng.Rep0()
    sock.listen("inproc://af-test-closed-race")
    ctx = _nngio.new_context(sock)
    _nngio.close_socket(sock)
    with pytest.raises(pynng.Closed):
        _nngio.recv(ctx)
