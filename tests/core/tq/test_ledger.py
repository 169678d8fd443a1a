"""Pure tests of the queue manager's ledger: allocation, capacity, freeing."""

import pytest

from asyncflow.core.tq.balance import balanced_parts
from asyncflow.core.tq.ledger import Ledger, shard_of


def test_allocation_gives_contiguous_groups_and_fresh_ids():
    ledger = Ledger(["train"], capacity_rows=100)
    a = ledger.try_allocate(2, 3, step=7)
    b = ledger.try_allocate(1, 2)
    assert [m.index for m in a + b] == list(range(8))
    assert [m.group_id for m in a] == [0, 0, 0, 1, 1, 1]
    assert b[0].group_id == 2 and a[0].step == 7 and a[0].group_size == 3


def test_a_row_is_freed_once_every_task_acked_it():
    ledger = Ledger(["train", "ref"], capacity_rows=10)
    ledger.try_allocate(1, 4)
    assert ledger.acked("train", [0, 1]) == []
    assert ledger.acked("ref", [1, 2]) == [1]
    assert ledger.acked("train", [2, 2]) == [2]
    with pytest.raises(ValueError, match="unknown task 'reward'"):
        ledger.acked("reward", [0])


def test_capacity_makes_allocations_wait_in_arrival_order():
    ledger = Ledger(["train"], capacity_rows=4)
    ledger.try_allocate(1, 3)
    assert ledger.try_allocate(1, 2) is None
    ledger.wait("big", 1, 2)
    assert ledger.try_allocate(1, 1) is None  # would fit, but must not overtake "big"
    ledger.wait("small", 1, 1)
    assert ledger.serve_waiting() == []
    ledger.acked("train", [0])
    served = ledger.serve_waiting()
    assert [t for t, _ in served] == ["big"]
    ledger.acked("train", [1])
    assert [t for t, _ in ledger.serve_waiting()] == ["small"]
    with pytest.raises(ValueError, match="raise capacity_rows"):
        ledger.try_allocate(5, 1)


def test_snapshot_round_trip():
    ledger = Ledger(["train", "ref"], capacity_rows=8)
    ledger.try_allocate(2, 2)
    ledger.acked("train", [0, 1])
    ledger.acked("ref", [0])
    again = Ledger.restore(ledger.snapshot())
    assert again.live == ledger.live and again.next_index == 4 and again.next_group_id == 2
    assert again.acked("ref", [1]) == [1]


def test_stripes_spread_rows_over_shards():
    assert [shard_of(i, 2, 3) for i in range(8)] == [0, 0, 1, 1, 2, 2, 0, 0]


def test_balanced_parts_need_an_even_split():
    with pytest.raises(ValueError, match="multiple of dp_size"):
        balanced_parts([1, 2, 3], 2)
    assert balanced_parts([5, 1, 4, 2], 2) in ([[0, 1], [2, 3]], [[2, 3], [0, 1]])
