"""Refill's pure parts: a step's groups gathered over rounds (``StepGroups``), the
refill rounds' prompt positions, and the queue headroom that keeps a round from
waiting behind the loader's look-ahead."""

from __future__ import annotations

import random

import pytest

from asyncflow.actors.runtime.run_dir import PromptOrder
from asyncflow.algorithms.dynamic_sampling import StepGroups, choose_groups
from asyncflow.core.tq.ledger import Ledger


def rows(rewards_by_group: dict[int, list[float]]) -> tuple[list[int], list[float]]:
    return [g for g, rs in rewards_by_group.items() for _ in rs], [r for rs in rewards_by_group.values() for r in rs]


def test_one_round_makes_the_choice_of_choose_groups():
    rng = random.Random(0)
    for _ in range(200):
        num_groups, multiple = rng.choice([(1, 1), (2, 1), (4, 2), (4, 4), (3, 3)])
        by_group = {g: [rng.choice([0.0, 1.0]) for _ in range(2)] for g in rng.sample(range(50), rng.randint(multiple, 8))}
        steps = StepGroups(num_groups, multiple)
        steps.add(*rows(by_group))
        assert steps.choice() == choose_groups(*rows(by_group), num_groups, multiple)


def test_a_short_step_is_filled_by_later_rounds_in_arrival_order():
    steps = StepGroups(num_groups=3)
    steps.add(*rows({0: [1, 1], 1: [0, 1], 2: [0, 0]}))
    assert not steps.full and steps.num_informative == 1
    steps.add(*rows({3: [1, 0], 4: [0.5, 0.5], 5: [0.2, 0.3], 6: [0, 1]}))
    assert steps.full and steps.num_rounds == 2
    choice = steps.choice()
    assert choice.kept == [1, 3, 5] and choice.surplus == [6] and choice.filtered == [0, 2, 4] and choice.padded == []


def test_release_drops_every_group_of_equal_rewards_but_those_padding_may_keep_and_never_twice():
    steps = StepGroups(num_groups=4, multiple=2)
    steps.add(*rows({0: [1, 1], 1: [0, 0], 2: [1, 1]}))
    assert steps.release() == [2]  # groups 0 and 1 may still pad a step left without informative groups
    steps.add(*rows({3: [0, 0], 4: [0, 1]}))
    assert steps.release() == [3]
    choice = steps.choice()  # one informative group for two ranks: padded with the first group of equal rewards
    assert choice.kept == [4, 0] and choice.padded == [0] and choice.filtered == [1, 2, 3]
    assert not set(choice.kept) & {2, 3}


def test_a_step_still_short_after_its_rounds_trains_what_it_has():
    steps = StepGroups(num_groups=4, multiple=2)
    for first in (0, 10, 20):
        steps.add(*rows({first: [0, 1], first + 1: [1, 1]}))
    assert not steps.full
    choice = steps.choice()
    assert choice.kept == [0, 10] and choice.surplus == [20] and choice.filtered == [1, 11, 21]


def test_a_group_seen_in_an_earlier_round_is_refused():
    steps = StepGroups(num_groups=2)
    steps.add(*rows({0: [0, 1]}))
    with pytest.raises(ValueError, match=r"groups \[0\] were added in an earlier round"):
        steps.add(*rows({0: [0, 1], 1: [0, 1]}))


def test_refill_positions_are_their_own_pure_stream_and_the_steps_stream_is_unchanged():
    steps = PromptOrder(100, 8, shuffle=True, seed=3)
    old_epoch0 = list(range(100))
    random.Random(3 * 1_000_003 + 0).shuffle(old_epoch0)  # the steps' stream as it always was
    assert [steps.index(s, g) for s in range(12) for g in range(8)] == old_epoch0[:96]
    refill = PromptOrder(100, 8, shuffle=True, seed=3, stream=1)
    again = PromptOrder(100, 8, shuffle=True, seed=3, stream=1)
    positions = [(s, g) for s in range(30) for g in range(8)]
    assert [refill.index(s, g) for s, g in positions] == [again.index(s, g) for s, g in reversed(positions)][::-1]
    assert [refill.index(0, g) for g in range(8)] != [steps.index(0, g) for g in range(8)]
    assert sorted(refill.index(s, g) for s in range(13) for g in range(8) if s * 8 + g < 100) == list(range(100))


@pytest.mark.parametrize("headroom", [True, False])
def test_with_headroom_a_refill_round_fits_whatever_the_loader_ran_ahead_with(headroom):
    """Rows per round R = 8, a step trains up to P = 4 rows: the loader allocates new
    steps with R + P rows of headroom; step s keeps 3 rows, frees its other 5, and its
    refill round (no headroom) fits. Without the headroom it would wait forever."""
    R, P, k = 8, 4, 1
    H = R + P
    ledger = Ledger(["train"], capacity_rows=R * (k + 3) + H)
    step_s = ledger.try_allocate(4, 2, step=0, headroom=H if headroom else 0)
    assert step_s is not None
    while ledger.try_allocate(4, 2, step=1, headroom=H if headroom else 0) is not None:
        pass  # the loader runs ahead until the queue (less the headroom) is full
    ledger.wait("next step", 4, 2, step=9, headroom=H if headroom else 0)
    ledger.acked("train", [m.index for m in step_s[3:]])  # 3 rows of step s kept (informative), 5 freed
    # with headroom the next step still waits (the freed rows are the refill's room); without, it takes them
    assert (ledger.serve_waiting() == []) == headroom
    ledger.cancel("next step")  # the loader looks at its messages: RefillGroups
    refill = ledger.try_allocate(4, 2, step=0)
    assert (refill is not None) == headroom


def test_an_allocation_that_can_never_leave_its_headroom_free_is_refused():
    with pytest.raises(ValueError, match="with 6 rows of headroom in a queue of capacity_rows=10"):
        Ledger(["train"], capacity_rows=10).try_allocate(1, 5, headroom=6)
