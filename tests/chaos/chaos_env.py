"""The environment of the chaos kill test: two turns; its first step leaves a mark
(``AF_CHAOS_MARKS/env.*``) and holds 0.3 s, so a kill at a mark lands while the
trajectory is half done (one turn taken, its step in flight)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from asyncflow.envs.base import Action, Environment, Sample, Step

HOLD_S = 0.3


class HalfwayEnv(Environment):
    def reset(self, sample: Sample):
        self.turn = 0
        return None

    def step(self, action: Action) -> Step:
        self.turn += 1
        if self.turn == 1:
            marks = os.environ.get("AF_CHAOS_MARKS")
            if marks:
                (Path(marks) / f"env.{os.getpid()}.{time.monotonic_ns()}").touch()
            time.sleep(HOLD_S)
            return Step(observation="ok", reward=0.5)
        return Step(reward=0.5, done=True)
