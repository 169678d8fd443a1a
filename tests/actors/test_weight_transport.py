"""The weight transport interface (actors/weights/): one sender and one receiver per
transport, chosen once from ``[workflow] weight_transport``; the nng pair end to end
through a real weights actor."""

from __future__ import annotations

import threading

import pytest
import torch

from asyncflow.actors.runtime import messages
from asyncflow.actors.weights import WeightReceiver, WeightSender, build_receiver, build_sender
from asyncflow.actors.weights.actor import Publish, WeightSyncActor
from asyncflow.actors.weights.collective import CollectiveReceiver, CollectiveSender
from asyncflow.actors.weights.nng import NngReceiver, NngSender, joined
from asyncflow.bench.weights import bench_run_dir
from asyncflow.config.names import WEIGHTS
from asyncflow.core.actor import serve_actor
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.tensors import nbytes, to_torch
from asyncflow.core.transport import TransportConfig


class _Ctx:  # what the factories read of an actor context
    name, directory = "rollout.0", None
    transport = TransportConfig(scheme="inproc")


def test_the_config_chooses_the_sender_and_the_receiver_once():
    assert type(build_sender("nng", _Ctx(), 1 << 20, 10.0)) is NngSender
    assert type(build_receiver("nng", _Ctx(), 10.0)) is NngReceiver
    assert type(build_receiver("collective", _Ctx(), 10.0, device="cpu")) is CollectiveReceiver
    assert issubclass(CollectiveSender, WeightSender) and issubclass(CollectiveReceiver, WeightReceiver)
    with pytest.raises(ValueError, match="unknown weight transport 'ipc'"):
        build_sender("ipc", _Ctx(), 1 << 20, 10.0)


def test_the_nng_sender_keeps_the_two_newest_versions_and_names_a_dropped_one():
    sender = NngSender(chunk_bytes=64)
    named = [("a", torch.zeros(16)), ("b", torch.ones(16))]  # 64 bytes each: one chunk each
    for version in (1, 2, 3):
        ready = sender.publish(version, named, digest=version * 10)
    assert (ready.version, ready.num_chunks, ready.num_bytes, ready.digest) == (3, 2, 128, 30)
    assert sender.latest() == ready
    assert sender.serve(messages.GetWeightChunk(version=2, index=1)).names == ["b"]
    with pytest.raises(KeyError, match="weights v1 are no longer staged"):
        sender.serve(messages.GetWeightChunk(version=1, index=0))
    with pytest.raises(TypeError, match="same \\[workflow\\] weight_transport"):
        sender.serve(messages.StreamWeights(replica="rollout.0", group="g", backend="gloo"))


@pytest.mark.timeout(30)
def test_a_tensor_larger_than_a_chunk_travels_in_pieces_of_at_most_a_chunk_and_arrives_whole():
    # a real float32 embedding sent whole can pass the frame limit (Qwen2.5-7B's: 2.18 GB > 2 GiB)
    sender = NngSender(chunk_bytes=1000)
    g = torch.Generator().manual_seed(0)
    named = [
        ("embed", torch.randn(101, 7, generator=g)),  # 2828 bytes: rows 0-34, 35-69, 70-100
        ("norm", torch.randn(300, generator=g).to(torch.bfloat16)),  # 600 bytes: whole
        ("scale", torch.tensor(2.0)),
        ("wide", torch.randn(1, 400, generator=g)),  # one row of 1600 bytes: cannot be cut, travels alone
        ("empty", torch.empty(0, 3)),
    ]
    ready = sender.publish(1, named, digest=5)
    chunks = [sender.serve(messages.GetWeightChunk(version=1, index=i)) for i in range(ready.num_chunks)]
    assert [n for c in chunks for n in c.names].count("embed") == 3
    assert all(sum(nbytes(t) for t in c.tensors) <= 1000 for c in chunks if c.names != ["wide"])
    assert ready.num_bytes == sum(t.numel() * t.element_size() for _, t in named)

    class Local:  # the weights actor's reference, answered by the sender in this thread
        def ask(self, msg, **kw):
            return sender.latest() if isinstance(msg, messages.GetLatestWeights) else sender.serve(msg)

    seen: list[int] = []
    version, got = NngReceiver(10.0).fetch(Local(), on_chunk=seen.append)
    assert version == 1 and seen == list(range(ready.num_chunks))
    assert [n for n, _ in got] == [n for n, _ in named]
    for (name, a), (_, b) in zip(named, got):
        assert b.dtype == a.dtype and b.shape == a.shape and torch.equal(a, b), name
    assert joined((n, to_torch(t)) for c in chunks for n, t in zip(c.names, c.tensors))[0][1].shape == (101, 7)


@pytest.mark.timeout(60)
def test_a_replica_fetches_a_published_version_over_nng_and_swaps_are_granted_one_at_a_time(tmp_path):
    transport = TransportConfig(scheme="inproc")
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    run_dir = bench_run_dir(str(tmp_path), substep_updates=True)
    weights = serve_actor(
        WeightSyncActor,
        WEIGHTS,
        transport,
        directory_address=directory.address,
        run_dir=run_dir,
        replicas=[],
        chunk_bytes=1 << 10,
    )
    dc.register(weights.entry())
    try:
        ref = dc.ref(WEIGHTS)
        assert ref.ask(messages.GetLatestWeights()).version == -1
        sent = [(f"w{i}", torch.randn(256)) for i in range(3)]  # 1024 bytes: a chunk each
        assert weights.pykka_ref.ask(Publish(1, sent, 7)) == 3072
        seen: list[int] = []
        version, got = NngReceiver(10.0).fetch(ref, on_chunk=seen.append)
        assert version == 1 and seen == [0, 1, 2]
        assert all(torch.equal(a, b) and n == m for (n, a), (m, b) in zip(sent, got))
        assert ref.ask(messages.GetLatestWeights()).digest == 7

        ref.ask(messages.AcquireSwap(replica="rollout.0", version=1))
        granted = threading.Event()
        waiter = threading.Thread(
            target=lambda: (ref.ask(messages.AcquireSwap(replica="rollout.1", version=1)), granted.set()), daemon=True
        )
        waiter.start()
        assert not granted.wait(0.3)  # rollout.1 waits while rollout.0 holds the grant
        ref.ask(messages.ReplicaRemoved(replica="rollout.0"))  # stopped while holding it: the grant moves on
        assert granted.wait(10)
    finally:
        weights.stop()
        directory.stop()


@pytest.mark.timeout(60)
def test_a_replica_fetches_the_announced_version_without_asking_and_the_latest_when_it_is_gone(tmp_path):
    transport = TransportConfig(scheme="inproc")
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    weights = serve_actor(
        WeightSyncActor,
        WEIGHTS,
        transport,
        directory_address=directory.address,
        run_dir=bench_run_dir(str(tmp_path)),
        replicas=[],
        chunk_bytes=1 << 10,
    )
    dc.register(weights.entry())
    asked: list[str] = []

    class Counting:  # the weights actor's reference, counting what is asked of it
        def ask(self, msg, **kw):
            asked.append(type(msg).__name__)
            return dc.ref(WEIGHTS).ask(msg, **kw)

    try:
        ref = dc.ref(WEIGHTS)
        named = [("w", torch.randn(256))]  # one chunk
        weights.pykka_ref.ask(Publish(1, named, 11))
        announced = ref.ask(messages.GetLatestWeights())
        version, got = NngReceiver(10.0).fetch(Counting(), announced=announced)
        assert version == 1 and torch.equal(got[0][1], named[0][1])
        assert asked == ["GetWeightChunk"]  # no GetLatestWeights: the announcement said what to fetch
        for v in (2, 3):  # the trainer moves on: v1 is no longer staged
            weights.pykka_ref.ask(Publish(v, [("w", torch.full((256,), float(v)))], v))
        asked.clear()
        version, got = NngReceiver(10.0).fetch(Counting(), announced=announced)
        assert version == 3 and float(got[0][1][0]) == 3.0
        assert asked == ["GetWeightChunk", "GetLatestWeights", "GetWeightChunk"]
    finally:
        weights.stop()
        directory.stop()
