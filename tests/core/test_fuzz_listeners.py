"""Malformed frames against every listener kind.

Each listener (directory, process host, queue manager, controller, shard, and the
collector role) gets frames with values nested deep, huge declared lengths, wrong
types, bit flips, truncations, random bytes and wrong secrets, over tcp. Every frame
must get a reply (a dead listener times out), and afterwards every listener still
answers a normal request. The default run sends 12,000 frames (about 2 s here);
``-m slow`` sends 60,000 more with another seed.
"""

from __future__ import annotations

import random
import threading

import pynng
import pytest

from asyncflow.core import frames, protocol
from asyncflow.core.actor import serve_actor
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.host import HostActor, start_actors
from asyncflow.core.ref import ActorRef
from asyncflow.core.tq.launch import queue_specs
from asyncflow.core.transport import TransportConfig

SECRET = b"fuzz-secret"


@pytest.fixture
def listeners(tmp_path):
    """name -> address of one live listener of each kind, all in this process."""
    from asyncflow.actors.driver.collector import CollectorActor

    transport = TransportConfig(scheme="tcp", secret=SECRET.decode())
    directory = start_directory(transport)
    client = DirectoryClient(directory.address, transport)
    host = serve_actor(HostActor, "host-fuzz", transport, directory_address=directory.address, stopped=threading.Event())
    specs = queue_specs(["train"], num_shards=1, capacity_rows=64, stripe_rows=4)
    queue = start_actors(specs.all(), transport, client)
    collector = serve_actor(
        CollectorActor,
        "collector",
        transport,
        directory_address=directory.address,
        run_dir=str(tmp_path),
        num_steps=1,
        progress=False,
    )
    served = [directory, host, *queue, collector]
    kinds = {"directory": directory, "host": host, "collector": collector}
    kinds.update({a.name: a for a in queue})
    assert {"tq.manager", "tq.controller.train", "tq.shard.0"} <= set(kinds), sorted(kinds)
    yield kinds, transport
    for actor in reversed(served):
        actor.stop()


def _frame(head: bytes, body: bytes = b"\xc0") -> bytes:
    return len(head).to_bytes(4, "little") + head + body


def _huge(rng: random.Random) -> bytes:
    """A msgpack value whose prefix declares far more than follows."""
    return rng.choice(
        [
            b"\xdd\xff\xff\xff\xff",  # array32 of 4 billion
            b"\xdf\xff\xff\xff\xff",  # map32
            b"\xdb\xff\xff\xff\xffabc",  # str32
            b"\xc6\x7f\xff\xff\xff",  # bin32
            b"\xc9\xff\xff\xff\xff\x01",  # ext32
            b"\xdc\xff\xff",  # array16 with nothing after it
        ]
    )


def _deep(rng: random.Random) -> bytes:
    depth = rng.choice([64, 500, 5000, 50000])
    return rng.choice([b"\x91", b"\x81\xa1k"]) * depth + b"\xc0"


def _fuzz_frame(rng: random.Random, target: str) -> bytes:
    good_head = bytes(frames.encode_frame(protocol.Header(target=target, kind=protocol.ASK, secret=SECRET)))[4:]
    ping = bytes(frames.encode_frame(protocol.Header(target=target, kind=protocol.ASK, secret=SECRET), protocol.Ping()))
    head_prefix = good_head[:-1]  # every field but timeout_s: append a hostile value in its place
    kind = rng.randrange(9)
    if kind == 0:  # nesting depth, in the header or the body
        return rng.choice([_frame(_deep(rng)), _frame(b"\x95" + good_head[1:] + _deep(rng)), _frame(good_head, _deep(rng))])
    if kind == 1:  # huge declared lengths
        return rng.choice(
            [
                (rng.randrange(1 << 20, 1 << 32)).to_bytes(4, "little") + good_head,
                _frame(_huge(rng)),
                _frame(head_prefix + _huge(rng)),
                _frame(good_head, _huge(rng)),
                _frame(good_head, b"\x81\xa4type" + _huge(rng)),
            ]
        )
    if kind == 2:  # wrong types in the header or the body
        return rng.choice(
            [
                _frame(b"\x94\x01\xa3abc\xc3\xc0"),
                _frame(b"\x81\xa1a\x01"),
                _frame(head_prefix + b"\xa3str"),
                _frame(good_head, b"\x2a"),
                _frame(good_head, b"\x92\x01\x02"),
                _frame(good_head, b"\x81\xa4type\x07"),
                _frame(good_head, b"\x81\xa4type\xa7NoSuchM"),
                _frame(good_head, b"\x82\xa4type\xa4Ping\xa4name\x01"),
                _frame(good_head, b"\x81\xa4type\xa6Stop!!"),
            ]
        )
    if kind == 3:  # bit flips of a valid Ping
        flipped = bytearray(ping)
        for _ in range(rng.randint(1, 8)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        return bytes(flipped)
    if kind == 4:  # truncations
        return ping[: rng.randrange(len(ping))]
    if kind == 5:  # random bytes
        return rng.randbytes(rng.randrange(0, 256))
    if kind == 6:  # a wrong or missing secret
        return rng.choice(
            [
                bytes(frames.encode_frame(protocol.Header(target=target, kind=protocol.ASK, secret=b"guess"), protocol.Ping())),
                bytes(frames.encode_frame(protocol.Header(target=target, kind=protocol.ASK), protocol.Ping())),
            ]
        )
    if kind == 7:  # another actor's name
        return bytes(frames.encode_frame(protocol.Header(target="nobody", kind=protocol.ASK, secret=SECRET), protocol.Ping()))
    return _frame(good_head, rng.randbytes(rng.randrange(1, 64)))  # a body of random bytes


def _fuzz(listeners, num_frames: int, seed: int) -> None:
    kinds, transport = listeners
    rng = random.Random(seed)
    per_listener = num_frames // len(kinds)
    num_answered = 0
    for name, actor in kinds.items():
        with pynng.Req0(recv_timeout=5000, send_timeout=5000, recv_max_size=1 << 20) as raw:
            raw.dial(actor.address, block=True)
            for k in range(per_listener):
                frame = _fuzz_frame(rng, actor.name)
                raw.send(frame)
                head, _ = frames.split_frame(raw.recv())  # a dead listener times out here
                reply = frames.decode_reply_header(head)
                assert reply.ok or reply.error_type in ("rejected", "auth", "unknown_actor", "remote"), (name, k, frame[:64])
                num_answered += 1
    assert num_answered == per_listener * len(kinds) >= num_frames - len(kinds)
    for name, actor in kinds.items():
        pong = ActorRef(actor.name, actor.address, transport).ask(protocol.Ping(), timeout_s=5)
        assert isinstance(pong, protocol.Pong), name
        assert pong.num_rejected_frames > per_listener // 4, (name, pong.num_rejected_frames)


@pytest.mark.timeout(120)
def test_twelve_thousand_malformed_frames_leave_every_listener_kind_answering(listeners):
    _fuzz(listeners, 12_000, seed=11)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sixty_thousand_malformed_frames_leave_every_listener_kind_answering(listeners):
    _fuzz(listeners, 60_000, seed=12)
