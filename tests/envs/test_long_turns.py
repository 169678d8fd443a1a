"""The long-tailed multi-turn toy environment of the partial-rollout bench
(asyncflow/toy/long_turns.py): a quarter of the prompts take LONG_TURNS turns, the
rest one, the same for every member of a group and in every run."""

from __future__ import annotations

import pytest

from asyncflow.envs.base import Action, Sample
from asyncflow.toy.long_turns import LONG_TURNS, LongTurnsEnv


def _turns(prompt: str) -> int:
    env = LongTurnsEnv()
    env.reset(Sample(prompt=prompt, prompt_ids=[], answer=""))
    for turn in range(1, LONG_TURNS + 1):
        if env.step(Action(text="", ids=[])).done:
            return turn
    raise AssertionError(f"{prompt!r}: not done after {LONG_TURNS} turns")


@pytest.mark.timeout(30)
def test_a_prompt_always_takes_as_many_turns_and_a_quarter_take_the_long_count():
    prompts = [f"{a}+{b}=" for a in range(20) for b in range(20)]
    turns = [_turns(p) for p in prompts]
    assert turns == [_turns(p) for p in prompts]  # a group's members (and a second run) agree
    assert set(turns) == {1, LONG_TURNS}
    assert 0.15 < turns.count(LONG_TURNS) / len(turns) < 0.35
