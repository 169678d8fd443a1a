"""Selection stays flat: a request that cannot be served yet costs no scan of the
ready rows, so the trainer's waiting whole-step request is linear in rows per step,
and a replica held back by the staleness bound costs nothing per poll, however many
rows of later steps wait in the queue: the queue host's cost per row must not grow with
the rows queued ahead or the replicas asking.

The work is counted as the rows a selection examines (``state._passes``), not timed."""

from __future__ import annotations

import random

import pytest

from asyncflow.core.protocol import RowFilter, RowMeta
from asyncflow.core.tq import state as state_mod
from asyncflow.core.tq.state import TaskState

G = 8


@pytest.fixture
def examined(monkeypatch):
    """How many rows selections examined against their filters."""
    count = [0]
    passes = state_mod._passes

    def counting(meta, filters):
        count[0] += 1
        return passes(meta, filters)

    monkeypatch.setattr(state_mod, "_passes", counting)
    return count


def write_groups(state, first_group, num_groups, step, columns=("prompt_ids",)):
    indices = [g * G + j for g in range(first_group, first_group + num_groups) for j in range(G)]
    metas = [RowMeta(index=i, group_id=i // G, group_size=G, step=step) for i in indices]
    state.on_written(0, indices, list(columns), metas)
    return indices


@pytest.mark.timeout(60)
def test_a_whole_step_request_asked_again_after_every_write_examines_each_row_a_bounded_number_of_times(examined):
    s = TaskState("train")
    rows_per_step = 4096
    step_filter = [RowFilter(field="step", lo=3, hi=3)]
    for g in range(rows_per_step // G):  # one group per write, the request tried after each (as the controller does)
        write_groups(s, g, 1, step=3)
        sel = s.select("trainer", ["prompt_ids"], rows_per_step, policy="group", filters=step_filter)
        if g < rows_per_step // G - 1:
            assert sel is None
    assert sel is not None and len(sel.indices) == rows_per_step
    assert examined[0] <= 4 * rows_per_step  # linear; a scan per write is rows_per_step**2 / (2 G) = 1M


@pytest.mark.timeout(60)
def test_a_request_held_back_by_the_staleness_bound_examines_no_row_of_a_later_step(examined):
    s = TaskState("rollout")
    write_groups(s, 0, 2000, step=5)  # 16,000 rows of a step the replica may not take yet
    for _ in range(100):
        sel = s.select("replica", ["prompt_ids"], 2 * G, policy="group", partial=True, filters=[RowFilter(field="step", hi=4)])
        assert sel is not None and sel.indices == []
    assert examined[0] == 0
    write_groups(s, 2000, 1, step=4)
    sel = s.select("replica", ["prompt_ids"], 2 * G, policy="group", partial=True, filters=[RowFilter(field="step", hi=4)])
    assert sel.indices == list(range(2000 * G, 2001 * G))
    assert examined[0] <= 2 * G


@pytest.mark.timeout(60)
def test_a_waiting_partial_request_with_min_rows_takes_nothing_until_that_many_are_admissible():
    s = TaskState("rollout")
    write_groups(s, 0, 1, step=2)
    assert (
        s.select("r", ["prompt_ids"], 4 * G, policy="group", partial=True, min_rows=G, filters=[RowFilter(field="step", hi=1)])
        is None
    )
    sel = s.select("r", ["prompt_ids"], 4 * G, policy="group", partial=True, min_rows=G, filters=[RowFilter(field="step", hi=2)])
    assert sel.indices == list(range(G))


@pytest.mark.timeout(60)
def test_selections_across_steps_keep_the_order_rows_became_ready_and_requeued_rows_first():
    """The step index changes no hand-out order: a random workload gives the same
    batches as a reference that scans every ready row in ready order."""
    rng = random.Random(7)
    s = TaskState("rollout")
    order: list[int] = []  # the reference: ready rows in ready order
    group_step: dict[int, int] = {}
    handed: dict[str, list[int]] = {}
    next_group = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.45:
            n, step = rng.randint(1, 3), rng.randint(0, 6)
            idx = write_groups(s, next_group, n, step=step)
            for g in range(next_group, next_group + n):
                group_step[g] = step
            next_group += n
            order += idx
        elif op < 0.9:
            hi = rng.randint(0, 6)
            lo = rng.choice([-(2**62), rng.randint(0, hi)])
            want = rng.randint(1, 3) * G
            consumer = rng.choice("abc")
            sel = s.select(
                consumer, ["prompt_ids"], want, policy="group", partial=True, filters=[RowFilter(field="step", lo=lo, hi=hi)]
            )
            expect = [i for i in order if lo <= group_step[i // G] <= hi][:want]
            assert sel.indices == expect
            order = [i for i in order if i not in set(expect)]
            handed.setdefault(consumer, []).extend(expect)
        else:
            consumer = rng.choice("abc")
            back, _ = s.requeue(consumer)
            assert back == sorted(handed.pop(consumer, []))
            order = back + order
