"""Pure tests of a task controller's state: policies, exactly-once, requeue, save/load."""

import random

import pytest

from asyncflow.core.protocol import RowFilter, RowMeta
from asyncflow.core.tq.state import ACKED, FREE, HANDED, TaskState


def write(state, indices, columns=("a", "b"), **meta):
    metas = [RowMeta(index=i, **meta) for i in indices]
    state.on_written(0, indices, list(columns), metas)


def test_rows_are_ready_only_when_every_requested_column_is_produced():
    s = TaskState("train")
    write(s, [0, 1, 2], columns=["a"])
    assert s.select("c", ["a", "b"], 1, partial=True).indices == []
    write(s, [1], columns=["b"])
    assert s.select("c", ["a", "b"], 2, partial=True).indices == [1]


def test_fifo_hands_rows_in_the_order_they_became_ready():
    s = TaskState("train")
    write(s, [5, 3], columns=["a"])
    s.select("x", ["b"], 1, partial=True)  # creates the view before the rows are ready
    write(s, [3], columns=["b"])
    write(s, [7], columns=["b"])
    write(s, [5], columns=["b"])
    assert s.select("c", ["b"], 3).indices == [3, 7, 5]


def test_a_non_partial_request_takes_nothing_until_the_whole_batch_is_ready():
    s = TaskState("train")
    write(s, [0, 1])
    assert s.select("c", ["a"], 3) is None
    assert s.state_of(0) == FREE
    write(s, [2])
    assert s.select("c", ["a"], 3).indices == [0, 1, 2]


def test_a_row_is_never_handed_twice_and_acks_are_checked():
    s = TaskState("train")
    write(s, range(10))
    first = s.select("c1", ["a"], 4).indices
    second = s.select("c2", ["a"], 6).indices
    assert not set(first) & set(second)
    assert s.select("c3", ["a"], 1, partial=True).indices == []
    assert s.ack("c1", first) == first
    assert s.ack("c1", first) == []  # idempotent
    with pytest.raises(ValueError, match="handed to 'c2'"):
        s.ack("c1", second[:1])
    assert all(s.state_of(i) == ACKED for i in first)


def test_requeue_returns_only_the_dead_consumers_unacked_rows_first_in_line():
    s = TaskState("train")
    write(s, range(6))
    dead = s.select("dead", ["a"], 3).indices
    s.ack("dead", dead[:1])
    alive = s.select("alive", ["a"], 1).indices
    assert s.requeue("dead") == (dead[1:], [])
    assert s.state_of(alive[0]) == HANDED
    assert s.select("new", ["a"], 2).indices == dead[1:]
    assert s.state_of(dead[0]) == ACKED


def test_requeue_acks_the_rows_whose_outputs_the_dead_consumer_already_put():
    s = TaskState("rollout")
    write(s, range(4))
    taken = s.select("dead", ["a"], 4).indices
    s.on_written(0, taken[:2], ["out1", "out2"])  # it put both outputs of two rows, then died
    s.on_written(0, taken[2:3], ["out1"])  # half of a third row's: redo it
    assert s.requeue("dead", ["out1", "out2"]) == (taken[2:], taken[:2])
    assert all(s.state_of(i) == ACKED for i in taken[:2])
    assert s.select("new", ["a"], 4, partial=True).indices == taken[2:]


def test_group_policy_hands_whole_groups_only():
    s = TaskState("train")
    write(s, [0, 1, 2], group_id=0, group_size=4)
    write(s, [4, 5], group_id=1, group_size=2)
    assert s.select("c", ["a"], 4, policy="group") is None
    assert s.select("c", ["a"], 2, policy="group").indices == [4, 5]
    write(s, [3], group_id=0, group_size=4)
    assert s.select("c", ["a"], 4, policy="group").indices == [0, 1, 2, 3]


def test_group_policy_rejects_a_batch_that_is_not_whole_groups():
    s = TaskState("train")
    write(s, [0, 1, 2, 3], group_id=0, group_size=4)
    with pytest.raises(ValueError, match="not a multiple of group size 4"):
        s.select("c", ["a"], 6, policy="group")


def test_group_policy_never_splits_groups_under_random_arrivals():
    rng = random.Random(0)
    s = TaskState("train")
    group_size = 4
    order = list(range(64 * group_size))
    rng.shuffle(order)
    seen = []
    for k in range(0, len(order), 7):
        chunk = order[k : k + 7]
        for i in chunk:
            s.on_written(0, [i], ["a"], [RowMeta(index=i, group_id=i // group_size, group_size=group_size)])
        while (sel := s.select("c", ["a"], 8, policy="group", partial=True)).indices:
            groups = {}
            for i in sel.indices:
                groups.setdefault(i // group_size, []).append(i)
            assert all(len(g) == group_size for g in groups.values())
            seen += sel.indices
    assert sorted(seen) == sorted(order)


def test_filters_gate_rows_by_step():
    s = TaskState("train")
    write(s, [0, 1], step=0)
    write(s, [2, 3], step=1)
    sel = s.select("c", ["a"], 2, filters=[RowFilter(field="step", lo=1, hi=1)])
    assert sel.indices == [2, 3]
    assert s.discard([RowFilter(field="step", hi=0)]) == [0, 1]
    assert s.num_discarded == 2  # what the gateway's pacing counts as never to be trained
    assert s.select("c", ["a"], 1, partial=True).indices == []


def test_dp_parts_have_equal_counts_and_balanced_lengths():
    s = TaskState("train")
    lengths = [100, 10, 90, 20, 80, 30, 70, 40]
    for i, n in enumerate(lengths):
        s.on_written(0, [i], ["a"], [RowMeta(index=i, prompt_len=0, response_len=n)])
    sel = s.select("c", ["a"], 8, dp_size=2)
    totals = [sum(lengths[sel.indices[p]] for p in part) for part in sel.parts]
    assert [len(p) for p in sel.parts] == [4, 4]
    assert abs(totals[0] - totals[1]) <= 20
    assert sorted(p for part in sel.parts for p in part) == list(range(8))


def test_dp_parts_keep_groups_whole():
    s = TaskState("train")
    for g in range(4):
        rows = [g * 2, g * 2 + 1]
        s.on_written(0, rows, ["a"], [RowMeta(index=i, group_id=g, group_size=2, response_len=10 * (g + 1)) for i in rows])
    sel = s.select("c", ["a"], 8, policy="group", dp_size=2)
    for part in sel.parts:
        groups = [sel.indices[p] // 2 for p in part]
        assert all(groups.count(g) == 2 for g in groups)
    # 10+10+40+40 = 100 vs 20+20+30+30 = 100
    assert [sum((sel.indices[p] // 2 + 1) * 10 for p in part) for part in sel.parts] == [100, 100]


def test_forget_drops_rows_and_a_snapshot_restores_the_state_with_handed_rows_freed():
    s = TaskState("train")
    write(s, range(8), step=3)
    s.on_written(1, [8], ["a"])
    handed = s.select("c", ["a", "b"], 4).indices
    s.ack("c", handed[:2])
    s.forget([handed[0]])
    t = TaskState.from_bytes(s.to_bytes())
    assert t.num_rows == s.num_rows == 8
    assert t.acked_indices() == [handed[1]]
    assert t.state_of(handed[2]) == FREE  # handed, not acked: handed out again after a restart
    assert t.meta(5) == s.meta(5) and t.meta(5).step == 3
    assert t.shard(8) == 1
    again = t.select("c2", ["a", "b"], 6).indices
    assert sorted(again) == sorted(handed[2:] + [4, 5, 6, 7])


def test_readiness_names_missing_columns():
    s = TaskState("train")
    write(s, [0, 1], columns=["a"])
    r = s.readiness(["a", "b"])
    assert r.num_ready == 0 and r.num_missing == {"a": 0, "b": 2}


@pytest.mark.timeout(10)
def test_requeue_retires_the_consumers_incarnations_and_admits_a_new_one():
    s = TaskState("train")
    s.admit("reward.0", "old")
    s.admit("other", "keep")
    s.requeue("reward.0")
    with pytest.raises(ValueError, match="'reward.0' .*was requeued as dead.*makes a new TQClient"):
        s.admit("reward.0", "old")
    s.admit("reward.0", "new")  # the restarted consumer
    s.admit("other", "keep")  # another consumer is untouched
    s.admit("reward.0", "")  # a client that does not say is not checked
    s.requeue("reward.0")
    with pytest.raises(ValueError, match="was requeued"):
        s.admit("reward.0", "new")
