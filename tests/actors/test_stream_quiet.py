"""A partial-rollout stream's quiet spell (actors/rollout/stream.QuietSpell): after the queue
had nothing admissible, the stream asks again at once on a new version, and otherwise after
a wait that doubles with each empty answer at that version, up to a cap."""

from __future__ import annotations

import pytest

from asyncflow.actors.rollout.stream import QuietSpell


@pytest.mark.timeout(10)
def test_empty_answers_at_one_version_space_the_asks_out_doubling_up_to_the_cap():
    quiet = QuietSpell(first_s=0.05, max_s=0.4)
    assert quiet.asks(3, now=0.0)  # nothing heard yet
    now, waits = 0.0, []
    for _ in range(6):
        quiet.empty(3, now)
        waits.append(round(quiet.until - now, 3))
        assert not quiet.asks(3, now + waits[-1] / 2)
        now = quiet.until
        assert quiet.asks(3, now)
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.4, 0.4]


@pytest.mark.timeout(10)
def test_a_new_version_asks_at_once_and_starts_the_spell_over():
    quiet = QuietSpell(first_s=0.05, max_s=0.4)
    for t in (0.0, 0.05, 0.15):
        quiet.empty(3, t)
    assert not quiet.asks(3, 0.2) and quiet.asks(4, 0.2)  # the staleness gate moved
    quiet.empty(4, 0.2)
    assert quiet.until == pytest.approx(0.25)


@pytest.mark.timeout(10)
def test_rows_handed_out_end_the_spell():
    quiet = QuietSpell(first_s=0.05)
    quiet.empty(3, 0.0)
    quiet.empty(3, 0.05)
    quiet.got()
    assert quiet.asks(3, 0.06)
    quiet.empty(3, 0.06)
    assert quiet.until == pytest.approx(0.11)  # a fresh spell: the first wait again
