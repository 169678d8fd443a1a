"""The TransferQueue over real sockets and processes: exactly-once consumption,
group-complete batches, backpressure, timeouts, requeue, save/load."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import _workers  # noqa: E402  (tests/core/tq is on sys.path; spawned processes import it by name)
import numpy as np
import pytest
import torch

from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.errors import RemoteError
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.errors import BatchTimeout, QueueFull
from asyncflow.core.tq.launch import spawn_queue
from asyncflow.core.transport import TransportConfig

SPAWN = mp.get_context("spawn")


@pytest.fixture
def cluster(tmp_path):
    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path / "ipc"))
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    queues = []
    clients = []

    def start(tasks=("train",), num_shards=2, capacity_rows=4096, stripe_rows=4, separate=False, **client_kwargs):
        fresh = DirectoryClient(directory.address, transport)  # no cached refs of an earlier queue
        queues.append(spawn_queue(fresh, transport, list(tasks), num_shards, capacity_rows, stripe_rows, separate=separate))
        client = TQClient(fresh, **client_kwargs)
        clients.append(client)
        return client

    yield start, dc, directory.address, queues
    for c in clients:
        c.close()
    for q in queues:
        q.stop()
    directory.stop()


def _wait_for(predicate, timeout_s=10.0):
    """Poll remote state (each probe is a round trip) until ``predicate`` holds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")


def test_rows_come_back_intact_from_several_shards_inline_and_through_shared_memory(cluster):
    start, *_ = cluster
    tq = start(num_shards=2, stripe_rows=2, shm_min_bytes=4096, reserve_rows=0)
    metas = tq.allocate(6, step=1)
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 100, n) for n in (3, 5000, 7, 1, 2048, 9)]  # some puts go through /dev/shm
    bf16 = [torch.randn(n).to(torch.bfloat16) for n in (3, 5000, 7, 1, 2048, 9)]
    for m, a in zip(metas, ids):
        m.response_len = len(a)
    tq.put([m.index for m in metas], {"ids": ids, "logp": bf16}, metas)
    batch = tq.get_batch("train", ["ids", "logp"], 6)
    order = [m.index for m in metas]
    for k, index in enumerate(batch.indices):
        np.testing.assert_array_equal(batch.columns["ids"][k], ids[order.index(index)])
        assert torch.equal(batch.torch("logp")[k].view(torch.bfloat16), bf16[order.index(index)])
        assert batch.metas[k].response_len == len(ids[order.index(index)]) and batch.metas[k].step == 1
    assert len(set(batch.metas[k].index for k in range(6))) == 6
    tq.ack(batch)
    _wait_for(lambda: tq.status().num_live_rows == 0)
    _wait_for(lambda: all(s.num_rows == 0 for s in tq.shard_stats()))  # the shards are told after


def test_each_row_is_consumed_exactly_once_per_task_by_concurrent_consumer_processes(cluster):
    start, _, address, _ = cluster
    tasks = ["train", "reference"]
    tq = start(tasks=tasks, num_shards=2, reserve_rows=0)
    total = 240
    counters = {t: SPAWN.Value("i", 0) for t in tasks}
    out = SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_workers.consume, args=(address, t, ["ids"], 4, "fifo", total, counters[t], out))
        for t in tasks
        for _ in range(3)
    ]
    for p in procs:
        p.start()
    for _ in range(0, total, 8):  # rows arrive while the consumers run
        metas = tq.allocate(8)
        tq.put([m.index for m in metas], {"ids": [np.array([m.index]) for m in metas]})
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    for t in tasks:
        seen = []
        for task, batches in results:
            if task == t:
                for indices, _, first in batches:
                    assert indices == first  # each row carries its own data
                    seen += indices
        assert sorted(seen) == list(range(total))  # every row once: none twice, none lost
    _wait_for(lambda: tq.status().num_live_rows == 0)  # freed once both tasks acked


def test_group_policy_hands_whole_groups_even_when_rows_arrive_interleaved(cluster):
    start, _, address, _ = cluster
    start(num_shards=2, reserve_rows=0)  # the queue the processes below dial at `address`
    num_groups, group_size = 24, 4
    counter = SPAWN.Value("i", 0)
    out = SPAWN.Queue()
    consumers = [
        SPAWN.Process(
            target=_workers.consume, args=(address, "train", ["ids"], 8, "group", num_groups * group_size, counter, out)
        )
        for _ in range(2)
    ]
    producer = SPAWN.Process(target=_workers.produce_groups, args=(address, num_groups, group_size, 3))
    for p in consumers + [producer]:
        p.start()
    results = [out.get(timeout=60) for _ in consumers]
    for p in consumers + [producer]:
        p.join(30)
        assert p.exitcode == 0
    groups_seen = []
    for _, batches in results:
        for indices, group_ids, _ in batches:
            assert len(indices) == 8
            for g in set(group_ids):
                assert group_ids.count(g) == group_size
            groups_seen += sorted(set(group_ids))
    assert sorted(groups_seen) == list(range(num_groups))


def test_a_full_queue_blocks_the_producer_until_rows_are_freed(cluster):
    start, *_ = cluster
    tq = start(capacity_rows=8, reserve_rows=0)
    first = tq.allocate(2, group_size=4)
    got = {}
    thread = threading.Thread(target=lambda: got.setdefault("metas", tq.allocate(1, group_size=4, timeout_s=30)))
    thread.start()
    _wait_for(lambda: tq.status().num_waiting_allocations == 1)
    assert thread.is_alive() and "metas" not in got
    tq.put([m.index for m in first[:4]], {"ids": [np.zeros(2)] * 4})
    batch = tq.get_batch("train", ["ids"], 4)
    tq.ack(batch)  # frees the first group: the waiting producer goes on
    thread.join(10)
    assert not thread.is_alive() and [m.index for m in got["metas"]] == [8, 9, 10, 11]
    with pytest.raises(QueueFull, match=r"8 of capacity_rows=8 rows live.*'train' has not acked 8.*raise capacity_rows"):
        tq.allocate(1, timeout_s=0.3)


def test_a_consumer_timeout_names_the_task_the_missing_columns_and_the_ready_rows(cluster):
    start, *_ = cluster
    tq = start(reserve_rows=0)
    metas = tq.allocate(3)
    tq.put([m.index for m in metas], {"input_ids": [np.zeros(4)] * 3})
    tq.put([metas[0].index], {"old_logp": [np.zeros(4)]})
    t0 = time.monotonic()
    with pytest.raises(BatchTimeout) as err:
        tq.get_batch("train", ["input_ids", "old_logp"], 2, timeout_s=0.5)
    assert time.monotonic() - t0 < 5
    text = str(err.value)
    assert "task 'train'" in text and "1 rows ready" in text and "'old_logp' on 2 rows" in text
    assert len(tq.get_batch("train", ["input_ids", "old_logp"], 2, partial=True)) == 1
    with pytest.raises(ValueError, match="no task 'critic'"):
        tq.get_batch("critic", ["input_ids"], 1)


def test_rows_of_a_killed_consumer_are_requeued_to_another(cluster):
    start, _, address, _ = cluster
    tq = start(reserve_rows=0)
    metas = tq.allocate(6)
    tq.put([m.index for m in metas], {"ids": [np.array([m.index]) for m in metas]})
    got = SPAWN.Queue()
    holder = SPAWN.Process(target=_workers.hold_rows, args=(address, "train", 4, got))
    holder.start()
    dead_consumer, held = got.get(timeout=60)
    holder.kill()
    holder.join(10)
    rest = tq.get_batch("train", ["ids"], 2)
    assert not set(rest.indices) & set(held)
    assert tq.requeue("train", dead_consumer) == 4
    again = tq.get_batch("train", ["ids"], 4)
    assert sorted(again.indices) == sorted(held)


@pytest.mark.timeout(120)
def test_a_restarted_consumer_gets_every_row_that_arrives_after_the_requeue_of_its_dead_waiting_self(cluster):
    start, _, address, _ = cluster
    tq = start(reserve_rows=0)
    for trial in range(3):
        name = f"reward.{trial}"  # a restarted worker reuses its name
        started = SPAWN.Event()
        old = SPAWN.Process(target=_workers.wait_for_rows, args=(address, "train", name, started))
        old.start()
        assert started.wait(60)
        _wait_for(lambda: tq.task_status("train").num_waiting == 1, timeout_s=30)  # its get waits
        old.kill()
        old.join(10)
        tq.requeue("train", name)
        assert tq.task_status("train").num_waiting == 0  # the dead incarnation's get went with it
        new = TQClient(tq.directory, consumer=name, timeout_s=5)
        metas = tq.allocate(2)
        tq.put([m.index for m in metas], {"ids": [np.array([m.index]) for m in metas]})
        batch = new.get_batch("train", ["ids"], 2, timeout_s=2)
        assert sorted(batch.indices) == [m.index for m in metas]  # none went to the dead one
        new.ack(batch)
        new.close()


@pytest.mark.timeout(60)
def test_requests_of_a_requeued_incarnation_are_refused_with_the_reason(cluster):
    start, *_ = cluster
    tq = start(reserve_rows=0)
    old = TQClient(tq.directory, consumer="reward.0", timeout_s=5)
    metas = tq.allocate(2)
    tq.put([m.index for m in metas], {"ids": [np.array([m.index]) for m in metas]})
    held = old.get_batch("train", ["ids"], 1)
    assert tq.requeue("train", "reward.0") == 1
    with pytest.raises(RemoteError, match="was requeued"):
        old.get_batch("train", ["ids"], 1, timeout_s=1)
    with pytest.raises(RemoteError, match="was requeued"):
        old.ack(held)
    new = TQClient(tq.directory, consumer="reward.0", timeout_s=5)
    assert sorted(new.get_batch("train", ["ids"], 2).indices) == [m.index for m in metas]
    old.close()
    new.close()


def test_save_and_load_restore_the_queue_in_new_processes(cluster, tmp_path):
    start, dc, _, queues = cluster
    tq = start(tasks=("train", "reference"), num_shards=2, reserve_rows=0, shm_min_bytes=1024)
    metas = tq.allocate(4, group_size=2, step=5)
    values = {m.index: np.arange(m.index, m.index + 300) for m in metas}  # 2.4 kB: through /dev/shm
    tq.put([m.index for m in metas], {"ids": [values[m.index] for m in metas]}, metas)
    done = tq.get_batch("train", ["ids"], 2)
    tq.ack(done)
    held = tq.get_batch("train", ["ids"], 2)  # handed out, not acked at save time
    both = tq.get_batch("reference", ["ids"], 8)
    tq.ack(both)  # now `done` rows are acked by both tasks: freed
    _wait_for(lambda: tq.status().num_live_rows == 6)
    saved = tq.save(str(tmp_path / "ckpt"))
    assert saved.num_rows == 6
    queues.pop().stop()
    tq.close()

    tq2 = start(tasks=("train", "reference"), num_shards=2, reserve_rows=0)
    assert tq2.status().next_index == 0
    loaded = tq2.load(str(tmp_path / "ckpt"))
    assert loaded.num_rows == 6
    status = tq2.status()
    assert status.next_index == 8 and status.num_live_rows == 6
    batch = tq2.get_batch("train", ["ids"], 6)  # un-acked rows come back, acked ones never
    assert sorted(batch.indices) == sorted(i for i in values if i not in done.indices)
    assert set(held.indices) <= set(batch.indices)
    for k, index in enumerate(batch.indices):
        np.testing.assert_array_equal(batch.columns["ids"][k], values[index])
        assert batch.metas[k].step == 5 and batch.metas[k].group_size == 2
    assert tq2.get_batch("reference", ["ids"], 1, partial=True).indices == []
    tq2.ack(batch)
    _wait_for(lambda: tq2.status().num_live_rows == 0)
    assert tq2.allocate(1)[0].index == 8


def test_a_waiting_request_that_cannot_be_whole_groups_fails_with_the_reason(cluster):
    start, *_ = cluster
    tq = start(reserve_rows=0)
    metas = tq.allocate(1, group_size=4)
    got = {}

    def ask():
        try:
            tq.get_batch("train", ["ids"], 6, policy="group", timeout_s=20)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            got["error"] = exc

    thread = threading.Thread(target=ask)
    thread.start()
    _wait_for(lambda: tq.task_status("train").num_waiting == 1)
    tq.put([m.index for m in metas], {"ids": [np.zeros(1)] * 4}, metas)
    thread.join(10)
    assert "batch_size 6 is not a multiple of group size 4" in str(got["error"])
