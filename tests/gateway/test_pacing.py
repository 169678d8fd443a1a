"""The pacer's count (gateway/pacing.py): pure state, no HTTP."""

from __future__ import annotations

import pytest

from asyncflow.gateway.pacing import Pacer

pytestmark = pytest.mark.timeout(10)


def start(pacer: Pacer, version: int) -> bool:
    ticket = pacer.ticket()
    if pacer.admit(ticket, version):
        return True
    pacer.cancel(ticket)
    return False


def test_at_most_staleness_plus_one_steps_of_sessions_start_before_the_version_moves():
    pacer = Pacer(per_step=4, staleness=1, version=0)
    assert [start(pacer, 0) for _ in range(9)] == [True] * 8 + [False]
    assert start(pacer, 1)  # step 0 trained (version 1 served): room for one step more
    assert [start(pacer, 1) for _ in range(4)] == [True] * 3 + [False]


def test_with_staleness_0_only_the_sessions_of_one_step_are_under_way():
    pacer = Pacer(per_step=4, staleness=0, version=3)
    assert [start(pacer, 3) for _ in range(5)] == [True] * 4 + [False]
    assert [start(pacer, 4) for _ in range(5)] == [True] * 4 + [False]


def test_sessions_dropped_or_discarded_or_never_started_give_their_room_back():
    pacer = Pacer(per_step=2, staleness=0, version=0, discarded=5)
    assert [start(pacer, 0) for _ in range(3)] == [True, True, False]
    pacer.dropped(1)  # no reward in time: never trained
    assert start(pacer, 0) and not start(pacer, 0)
    pacer.discarded(6)  # the trainer discarded one more (the queue's count since it started)
    assert start(pacer, 0) and not start(pacer, 0)
    pacer.release()  # an admitted session whose first turn failed
    assert start(pacer, 0) and not start(pacer, 0)


def test_what_is_ahead_at_the_start_counts():
    pacer = Pacer(per_step=4, staleness=1, version=7, ahead=6)  # rows in the queue, sessions restored
    assert [start(pacer, 7) for _ in range(3)] == [True, True, False]


def test_first_come_first_served_and_a_ticket_that_gives_up_lets_the_next_one_in():
    pacer = Pacer(per_step=1, staleness=0, version=0)
    first, second, third = pacer.ticket(), pacer.ticket(), pacer.ticket()
    assert not pacer.admit(second, 0)  # room, but the first is ahead of it
    assert pacer.admit(first, 0)
    assert not pacer.admit(second, 0)  # no room
    pacer.cancel(second, refused=True)
    assert not pacer.admit(third, 0)
    assert pacer.admit(third, 1)
    counts = pacer.counts
    assert (counts.held, counts.refused, counts.waiting) == (2, 1, 0)


def test_a_group_starts_whole_and_its_other_sessions_go_at_once():
    pacer = Pacer(per_step=4, staleness=0, version=0)
    lone = pacer.ticket()
    assert pacer.admit(lone, 0)  # 1 ahead
    first = pacer.ticket()
    assert not pacer.admit(first, 0, "g", 4)  # the group of 4 does not fit beside it
    pacer.release()  # the lone one did not start after all
    assert pacer.admit(first, 0, "g", 4)  # now it fits: all 4 counted
    waiting = pacer.ticket()
    assert not pacer.admit(waiting, 0)  # nothing else fits
    assert all(pacer.admit(pacer.ticket(), 0, "g", 4) for _ in range(3))  # the group's others, past the line
    assert not pacer.admit(pacer.ticket(), 0, "g", 4)  # a fifth session of the key starts a new group


def test_a_settled_group_gives_back_the_places_its_sessions_did_not_take():
    pacer = Pacer(per_step=4, staleness=0, version=0)
    assert pacer.admit(pacer.ticket(), 0, "g", 4)
    assert pacer.admit(pacer.ticket(), 0, "g", 4)  # 2 of its 4 sessions came
    assert not start(pacer, 0)
    pacer.settle("g")  # written (or dropped) with 2: two places free
    assert start(pacer, 0) and start(pacer, 0) and not start(pacer, 0)


def test_a_replica_restarted_behind_the_trainer_counts_from_the_version_it_swaps_in():
    pacer = Pacer(per_step=4, staleness=0, version=0)  # started with the launch's weights; the trainer is at 9
    assert [start(pacer, 9) for _ in range(5)] == [True] * 4 + [False]  # one step's sessions, not nine steps' more
