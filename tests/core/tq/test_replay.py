"""The queue's requests that hand something out or change it are served once, however
many copies of one request come (a client resends to a queue process that was frozen:
core/retry.py, core/replay.py): a GetBatch sent twice hands its rows out once and
both copies get them, as does a copy that comes while the first still waits; an
Allocate sent twice allocates once; a shared-memory put sent twice is stored once."""

from __future__ import annotations

import threading
import time

import msgspec
import numpy as np
import pytest

from asyncflow.core import protocol
from asyncflow.core.actor import serve_actor
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.errors import ActorTimeout, RemoteError
from asyncflow.core.host import import_object
from asyncflow.core.ref import ActorRef
from asyncflow.core.tq import shm
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.launch import queue_specs
from asyncflow.core.transport import TransportConfig


@pytest.fixture
def queue():
    """A queue of one task ("train") and one shard, served in this process."""
    transport = TransportConfig(scheme="inproc")
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    served = []
    for spec in queue_specs(["train"], num_shards=1, capacity_rows=64, stripe_rows=4).all():
        kwargs = msgspec.msgpack.decode(spec.kwargs)
        actor = serve_actor(import_object(spec.cls), spec.name, transport, directory_address=directory.address, **kwargs)
        dc.register(actor.entry())
        served.append(actor)
    tq = TQClient(dc, consumer="worker", reserve_rows=0)
    yield tq, dc, {a.name: a for a in served}
    tq.close()
    for actor in reversed(served):
        actor.stop()
    directory.stop()


def _put(tq: TQClient, num_rows: int) -> list[int]:
    metas = tq.allocate(num_rows)
    indices = [m.index for m in metas]
    tq.put(indices, {"ids": [np.array([i]) for i in indices]}, metas)
    return indices


def _get(tq: TQClient, batch_size: int, timeout_s: float = 0.2) -> protocol.GetBatch:
    return protocol.GetBatch(
        consumer=tq.consumer, columns=["ids"], batch_size=batch_size, timeout_s=timeout_s, incarnation=tq.incarnation
    )


@pytest.mark.timeout(60)
def test_a_get_batch_sent_twice_hands_its_rows_out_once_and_both_copies_get_them(queue):
    tq, dc, _ = queue
    rows = _put(tq, 4)
    controller = dc.ref("tq.controller.train")
    first = controller.ask(_get(tq, 2), sender="consumer-thread", seq=1)
    copy = controller.ask(_get(tq, 2), sender="consumer-thread", seq=1)
    assert first.indices == copy.indices and len(first.indices) == 2
    nxt = controller.ask(_get(tq, 2), sender="consumer-thread", seq=2)
    assert sorted(first.indices + nxt.indices) == rows  # the copy took nothing: the other two rows are left
    assert tq.task_status("train").num_pending == {"worker": 4}
    with pytest.raises(RemoteError, match="no batch of 1 rows"):
        controller.ask(_get(tq, 1), sender="consumer-thread", seq=3)


@pytest.mark.timeout(60)
def test_a_copy_that_comes_while_the_first_get_waits_gets_its_rows(queue):
    tq, dc, served = queue
    controller = dc.ref("tq.controller.train")
    msg = _get(tq, 2, timeout_s=30)
    with pytest.raises(ActorTimeout):  # the first copy waits for rows; its caller gives up on it
        controller.ask(msg, timeout_s=0.2, sender="consumer-thread", seq=1)
    out: list = []
    copy = threading.Thread(target=lambda: out.append(controller.ask(msg, timeout_s=30, sender="consumer-thread", seq=1)))
    copy.start()
    deadline = time.monotonic() + 10
    while served["tq.controller.train"].num_replayed < 1:  # the copy came and waits with the first
        assert time.monotonic() < deadline, "the copy never reached the controller"
        time.sleep(0.01)
    rows = _put(tq, 2)
    copy.join(10)
    assert [sorted(r.indices) for r in out] == [rows]
    status = tq.task_status("train")
    assert status.num_pending == {"worker": 2} and status.num_waiting == 0  # one request was served, once


@pytest.mark.timeout(60)
def test_an_allocate_sent_twice_allocates_once(queue):
    tq, dc, _ = queue
    manager = dc.ref("tq.manager")
    msg = protocol.Allocate(num_groups=2, group_size=2, step=0)
    first = manager.ask(msg, sender="producer-thread", seq=1)
    copy = manager.ask(msg, sender="producer-thread", seq=1)
    assert [m.index for m in first.metas] == [m.index for m in copy.metas]
    assert tq.status().num_live_rows == 4


@pytest.mark.timeout(60)
def test_a_shared_memory_put_sent_twice_is_stored_once(queue):
    tq, dc, _ = queue
    shard: ActorRef = dc.ref("tq.shard.0")
    metas = tq.allocate(1)
    reserved = shard.ask(protocol.ReserveShm(num_bytes=64), sender="producer-thread", seq=1)
    again = shard.ask(protocol.ReserveShm(num_bytes=64), sender="producer-thread", seq=1)
    assert (again.segment, again.offset) == (reserved.segment, reserved.offset)  # no second extent
    arena = shm.MAPPINGS.get(reserved.segment)
    arena[reserved.offset : reserved.offset + 8] = np.array([41], np.int64).view(np.uint8)
    column = protocol.ShmColumn(dtype="int64", shapes=[(1,)], segments=[0], offsets=[reserved.offset])
    put = protocol.PutRowsShm(
        indices=[metas[0].index],
        segment=reserved.segment,
        extent_offset=reserved.offset,
        extent_bytes=64,
        columns={"ids": column},
        metas=list(metas),
    )
    shard.ask(put, sender="producer-thread", seq=2)
    shard.ask(put, sender="producer-thread", seq=2)  # stored once: the copy is not refused for a spent extent
    batch = tq.get_batch("train", ["ids"], 1, timeout_s=5)
    assert batch.indices == [metas[0].index] and int(batch.columns["ids"][0][0]) == 41
