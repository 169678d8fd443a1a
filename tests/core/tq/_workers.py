"""Producer and consumer processes for the queue tests (spawned, so importable)."""

from __future__ import annotations

import numpy as np


def consume(directory: str, task: str, columns: list[str], batch_size: int, policy: str, total: int, counter, out) -> None:
    """Take batches until ``total`` rows of ``task`` were consumed by all consumers
    together (``counter``); report (indices, group ids, first values) per batch."""
    from asyncflow.core.tq.client import TQClient
    from asyncflow.core.tq.errors import BatchTimeout

    tq = TQClient(directory)
    batches = []
    while counter.value < total:
        try:
            batch = tq.get_batch(task, columns, batch_size, policy=policy, timeout_s=0.5)
        except BatchTimeout:
            continue
        first = [int(a[0]) for a in batch.columns[columns[0]]]
        batches.append((batch.indices, [m.group_id for m in batch.metas], first))
        tq.ack(batch)
        with counter.get_lock():
            counter.value += len(batch)
    tq.close()
    out.put((task, batches))


def produce_groups(directory: str, num_groups: int, group_size: int, seed: int) -> None:
    """Allocate groups, then write their rows one at a time in a shuffled order, so
    groups complete interleaved."""
    from asyncflow.core.tq.client import TQClient

    tq = TQClient(directory, reserve_rows=0)
    metas = tq.allocate(num_groups, group_size)
    order = np.random.default_rng(seed).permutation(len(metas))
    for k in order:
        m = metas[k]
        m.response_len = int(k % 7) + 1
        tq.put([m.index], {"ids": [np.full(m.response_len, m.index, np.int64)]}, [m])
    tq.close()


def hold_rows(directory: str, task: str, num_rows: int, got) -> None:
    """Take rows and never ack them (killed by the test)."""
    import threading

    from asyncflow.core.tq.client import TQClient

    tq = TQClient(directory)
    batch = tq.get_batch(task, ["ids"], num_rows, timeout_s=10)
    got.put((tq.consumer, batch.indices))
    threading.Event().wait()


def wait_for_rows(directory: str, task: str, consumer: str, started) -> None:
    """Block in one get as ``consumer`` (a worker's fixed name) and never return from
    it (killed by the test while it waits)."""
    from asyncflow.core.tq.client import TQClient

    tq = TQClient(directory, consumer=consumer)
    started.set()
    tq.get_batch(task, ["ids"], 1, timeout_s=60)
