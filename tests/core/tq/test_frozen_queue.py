"""A queue process frozen (SIGSTOP) for longer than its clients' ask timeout, then
continued (SIGCONT): the clients send their requests again until it answers
(core/retry.py), and it serves each once (core/replay.py). The consumer gets its rows,
exactly once: none handed out twice, none lost; an allocation is made once; a put to a
frozen shard is stored once, and reads back intact.

The clients' per-attempt timeout is 0.5 s (``TQClient(timeout_s=0.5)``); the test waits
until they have sent their requests several times (their log says so) before the queue
is continued: synchronised on those events, not on sleeps."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.launch import spawn_queue
from asyncflow.core.transport import TransportConfig

ATTEMPT_S = 0.5
REQUESTS = {"GetBatch", "Allocate", "ReserveShm", "PutRowsShm", "GetRows"}


@pytest.fixture
def queue(tmp_path):
    """A queue of task "train": the manager and the controller in one process, the shard in another."""
    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path / "ipc"))
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    processes = spawn_queue(dc, transport, ["train"], num_shards=1, capacity_rows=64, stripe_rows=4, separate=True)
    control, shard = processes.hosts
    clients: list[TQClient] = []

    def client(**kwargs) -> TQClient:
        clients.append(TQClient(DirectoryClient(directory.address, transport), timeout_s=ATTEMPT_S, reserve_rows=0, **kwargs))
        return clients[-1]

    yield client, control.pid, shard.pid
    for pid in (control.pid, shard.pid):
        os.kill(pid, signal.SIGCONT)  # whatever the test did: never leave a stopped process behind
    for c in clients:
        c.close()
    processes.stop()
    directory.stop()


class _Resends(logging.Handler):
    """Counts the copies the clients of this process sent again, per request type
    (core/retry.py logs each)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.counts: Counter[str] = Counter()
        self.changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "sending it again" in text or "sent again" in text:
            with self.changed:
                self.counts.update(w for w in re.findall(r"\b[A-Z][A-Za-z]+\b", text) if w in REQUESTS)
                self.changed.notify_all()

    def wait_for(self, counts: dict[str, int], or_done: Callable[[], bool], timeout_s: float = 60) -> None:
        """Until every request type of ``counts`` was sent again that many times (or ``or_done``). The
        condition is notified by resends only, so ``or_done`` (the request's thread ending) is looked at
        every 0.1 s: a request answered without resends must not hold the test for ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while not (all(self.counts[k] >= n for k, n in counts.items()) or or_done()):
                if time.monotonic() >= deadline:
                    return
                self.changed.wait(0.1)


@pytest.fixture
def resends():
    logger = logging.getLogger("asyncflow.core.retry")
    handler, level = _Resends(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # the test asserts on it
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.timeout(120)
def test_a_consumer_and_a_producer_of_a_frozen_queue_get_their_answers_exactly_once_when_it_wakes(queue, resends):
    client, control_pid, _ = queue
    producer, consumer = client(), client(consumer="reward.0")
    metas = producer.allocate(4)
    rows = [m.index for m in metas]
    producer.put(rows, {"ids": [np.array([i]) for i in rows]}, metas)
    os.kill(control_pid, signal.SIGSTOP)
    try:
        get, got = _in_thread(lambda: consumer.get_batch("train", ["ids"], 2, timeout_s=0.2))
        alloc, allocated = _in_thread(lambda: producer.allocate(2, timeout_s=0.2))
        # each client sent its request twice more: copies pile up in the frozen process
        resends.wait_for({"GetBatch": 2, "Allocate": 2}, or_done=lambda: not (get.is_alive() and alloc.is_alive()))
        assert "error" not in got and "error" not in allocated, (got, allocated)  # before the fix: ActorTimeout
        assert resends.counts["GetBatch"] >= 2 and resends.counts["Allocate"] >= 2, resends.counts
    finally:
        os.kill(control_pid, signal.SIGCONT)
    get.join(30)
    alloc.join(30)
    assert "value" in got and "value" in allocated, (got, allocated)
    first = got["value"]
    assert len(first) == 2 and set(first.indices) <= set(rows)
    rest = consumer.get_batch("train", ["ids"], 2, timeout_s=5)
    assert sorted(first.indices + rest.indices) == rows  # none lost, none handed twice
    assert len(consumer.get_batch("train", ["ids"], 4, partial=True)) == 0
    assert consumer.task_status("train").num_pending == {"reward.0": 4}
    assert len(allocated["value"]) == 2
    assert producer.status().num_live_rows == 6  # the allocation was made once, not once per copy
    consumer.ack(first)
    consumer.ack(rest)


@pytest.mark.timeout(120)
def test_a_put_and_a_read_to_a_frozen_shard_complete_once_when_it_wakes(queue, resends):
    client, _, shard_pid = queue
    producer = client(shm_min_bytes=0)  # every put through the shard's shared-memory arena: reserve, then put
    consumer = client(consumer="trainer")
    metas = producer.allocate(3)
    rows = [m.index for m in metas]
    os.kill(shard_pid, signal.SIGSTOP)
    try:
        put, done = _in_thread(lambda: producer.put(rows, {"ids": [np.full(8, i, np.int64) for i in rows]}, metas))
        resends.wait_for({"ReserveShm": 2}, or_done=lambda: not put.is_alive())
        assert "error" not in done, done  # before the fix: ActorTimeout
        assert resends.counts["ReserveShm"] >= 2, resends.counts
    finally:
        os.kill(shard_pid, signal.SIGCONT)
    put.join(30)
    assert not put.is_alive() and "error" not in done, done
    batch = consumer.get_batch("train", ["ids"], 3, timeout_s=5)
    assert sorted(batch.indices) == rows
    assert all((col == i).all() and col.shape == (8,) for i, col in zip(batch.indices, batch.columns["ids"]))
    os.kill(shard_pid, signal.SIGSTOP)
    try:
        read, values = _in_thread(lambda: consumer.read(rows, ["ids"]))
        resends.wait_for({"GetRows": 2}, or_done=lambda: not read.is_alive())
    finally:
        os.kill(shard_pid, signal.SIGCONT)
    read.join(30)
    assert "value" in values, values
    assert [int(col[0]) for col in values["value"]["ids"]] == rows
    assert [s.num_rows for s in producer.shard_stats()] == [3]  # stored once
