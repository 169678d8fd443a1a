"""Environments for the tiny end-to-end runs (loaded by dotted path from a config)."""

from __future__ import annotations

from asyncflow.envs.base import Action, Environment, Sample, Step

TOOL_RESULT = "tool says 7"


class TwoTurnEnv(Environment):
    """Two turns per trajectory whatever the model says: the first counts as a tool
    call answered with ``TOOL_RESULT``, the second ends the trajectory with reward 1.
    An untrained model's episodes are then multi-turn, with known figures
    (tool-call rate 1, reward 1), and a single-turn evaluation would score 0."""

    def reset(self, sample: Sample):
        self.turns = 0
        return None

    def step(self, action: Action) -> Step:
        self.turns += 1
        if self.turns == 1:
            return Step(observation=TOOL_RESULT, info={"tool_calls": 1})
        return Step(reward=1.0, done=True)
