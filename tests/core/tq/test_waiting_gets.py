"""A GetBatch that cannot be served yet waits in the controller, over real sockets: a
partial request with ``min_rows`` waits for that many admissible rows instead of
being asked again and again (no idle polls), is answered by the write that makes them
admissible, by the asker's own ``wake`` (a new version announced: its staleness bound
moved), or with no rows at its timeout. Many idle replicas then cost the queue host
nothing between writes."""

from __future__ import annotations

import threading

import pytest

from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.launch import spawn_queue
from asyncflow.core.transport import TransportConfig

G = 4


@pytest.fixture
def queue(tmp_path):
    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path / "ipc"))
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    procs = spawn_queue(dc, transport, ["rollout"], num_shards=1, capacity_rows=1024, separate=False)
    clients: list[TQClient] = []

    def client() -> TQClient:
        c = TQClient(DirectoryClient(directory.address, transport), reserve_rows=0)
        clients.append(c)
        return c

    yield client
    for c in clients:
        c.close()
    procs.stop()
    directory.stop()


def put_groups(tq: TQClient, num_groups: int, step: int) -> list[int]:
    import numpy as np

    metas = tq.allocate(num_groups, G, step=step)
    indices = [m.index for m in metas]
    tq.put(indices, {"prompt_ids": [np.arange(3) for _ in indices]}, metas)
    return indices


class Asker(threading.Thread):
    """One waiting request on a thread; ``done`` is set when it is answered."""

    def __init__(self, tq: TQClient, max_step: int, timeout_s: float = 60.0):
        super().__init__(daemon=True)
        self.tq, self.max_step, self.timeout_s = tq, max_step, timeout_s
        self.done = threading.Event()
        self.result = None

    def run(self) -> None:
        self.result = self.tq.get_meta(
            "rollout",
            ["prompt_ids"],
            2 * G,
            policy="group",
            partial=True,
            min_rows=G,
            max_step=self.max_step,
            timeout_s=self.timeout_s,
        )
        self.done.set()


def waiting(tq: TQClient, n: int = 1) -> bool:
    return tq.task_status("rollout").num_waiting == n


def wait_until(predicate, tries: int = 2000) -> None:
    """Synchronise on the controller's own count of waiting requests (each probe a round trip)."""
    for _ in range(tries):
        if predicate():
            return
    raise AssertionError("the controller never reached the state")


@pytest.mark.timeout(60)
def test_a_partial_request_with_min_rows_waits_in_the_controller_until_a_write_makes_rows_admissible(queue):
    loader, replica = queue(), queue()
    put_groups(loader, 3, step=5)  # held back by the staleness bound
    asker = Asker(replica, max_step=4)
    asker.start()
    wait_until(lambda: waiting(loader))
    assert not asker.done.is_set()
    admissible = put_groups(loader, 1, step=4)
    assert asker.done.wait(30)
    assert asker.result.indices == admissible


@pytest.mark.timeout(60)
def test_wake_answers_the_clients_waiting_request_with_no_rows_so_it_asks_again_with_its_new_bound(queue):
    loader, replica = queue(), queue()
    later = put_groups(loader, 2, step=5)
    asker = Asker(replica, max_step=4)
    asker.start()
    wait_until(lambda: waiting(loader))
    replica.wake("rollout")  # a new version was announced: the bound moves to 5
    assert asker.done.wait(30)
    assert asker.result.indices == []
    again = replica.get_meta("rollout", ["prompt_ids"], 2 * G, policy="group", partial=True, min_rows=G, max_step=5)
    assert sorted(again.indices) == sorted(later)


@pytest.mark.timeout(60)
def test_a_wake_that_reaches_the_controller_before_the_request_it_meant_still_wakes_it(queue):
    loader, replica = queue(), queue()
    put_groups(loader, 1, step=5)
    wakes = replica.wakes("rollout")  # the count a request sent now carries
    replica.wake("rollout")
    replica.flush_wakes()
    got = replica.get_meta(
        "rollout", ["prompt_ids"], 2 * G, policy="group", partial=True, min_rows=G, max_step=4, timeout_s=60, wakes=wakes
    )
    assert got.indices == []  # answered at once: it was sent before the wake


@pytest.mark.timeout(60)
def test_a_waiting_partial_request_that_times_out_gets_no_rows_not_an_error(queue):
    loader, replica = queue(), queue()
    put_groups(loader, 1, step=5)
    got = replica.get_meta("rollout", ["prompt_ids"], G, policy="group", partial=True, min_rows=G, max_step=4, timeout_s=0.2)
    assert got.indices == []


@pytest.mark.timeout(120)
def test_many_waiting_replicas_each_get_distinct_groups_in_the_order_they_asked(queue):
    loader = queue()
    replicas = [queue() for _ in range(6)]
    askers = []
    for k, r in enumerate(replicas):
        askers.append(Asker(r, max_step=1))
        askers[-1].start()
        wait_until(lambda n=k + 1: waiting(loader, n))
    first = put_groups(loader, 2, step=1)  # the first asker takes both (2 G)
    assert askers[0].done.wait(30)
    assert sorted(askers[0].result.indices) == sorted(first)
    rest = put_groups(loader, 10, step=0)
    for a in askers[1:]:
        assert a.done.wait(30)
    handed = [i for a in askers[1:] for i in a.result.indices]
    assert sorted(handed) == sorted(rest) and len(set(handed)) == len(handed)
    assert [a.result.indices for a in askers[1:]] == [rest[2 * G * k : 2 * G * (k + 1)] for k in range(5)]
