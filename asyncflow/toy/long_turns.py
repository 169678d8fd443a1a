"""An environment whose trajectories have long-tailed turn counts, for measuring
partial rollout with multi-turn (``examples/long_tail_turns.toml``,
``afctl bench e2e --partial-rollout``; docs/algorithms.md).

``LongTurnsEnv``: most trajectories end after one turn, those of a quarter of the
prompts take ``LONG_TURNS``; which is a pure function of the prompt (a group's
trajectories take as many turns), so two runs of one config (partial rollout off and
on) get the same work. Each step's
observation is a short text (``OBSERVATION``); the reward is 0 (the task's reward
functions score the transcript). The model's turns themselves end on the config's
stop tokens: their lengths are long-tailed too.

``SlowToolEnv``: the same, each step taking ``TOOL_S`` (a tool call's latency, as a
sandbox or an API has), during which its trajectory cannot go on.
"""

from __future__ import annotations

import random
import time
import zlib

from asyncflow.envs.base import Action, Environment, Sample, Step

LONG_TURNS = 6
LONG_FRACTION = 0.25
OBSERVATION = "go on"
TOOL_S = 0.02


class LongTurnsEnv(Environment):
    def reset(self, sample: Sample):
        u = random.Random(zlib.crc32(sample.prompt.encode())).random()
        self.turns_left = LONG_TURNS if u < LONG_FRACTION else 1
        return None

    def step(self, action: Action) -> Step:
        self.turns_left -= 1
        if self.turns_left <= 0:
            return Step(done=True)
        return Step(observation=OBSERVATION)


class SlowToolEnv(LongTurnsEnv):
    def step(self, action: Action) -> Step:
        time.sleep(TOOL_S)  # the tool's latency (not a synchronisation)
        return super().step(action)
