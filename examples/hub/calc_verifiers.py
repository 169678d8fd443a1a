"""The calculator task as a verifiers (v1) environment, played through asyncflow's
verifiers adapter (``asyncflow.envs.hub.verifiers``): ``python examples/hub/measure.py
--lib verifiers``.

Written against verifiers' interface only: ``CalcTaskset`` yields the problems
(``"37*48="``, answer ``"1776"``; 2000, seeded), ``CalcTask`` scores a trace by its last
reply, and ``CalcToolEnv.run`` plays an episode: the model answers the prompt; while its
reply calls ``<calc>...</calc>``, the env answers with the results (at most two calls).

``CalcHub`` is what ``env.path`` names; the run's data are the taskset's rows
(``write_data``: the prompt, and the task's key as the answer), which measure.py writes.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

from asyncflow.envs.calc import calc, calc_example
from asyncflow.envs.hub.verifiers import verifiers_env

CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
CONFIG = {"taskset": {"id": "calc_verifiers"}}


class CalcData(vf.TaskData):
    answer: str


class CalcTask(vf.Task[CalcData]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        return float(trace.last_reply == task.answer)


class CalcTaskset(vf.Taskset[CalcTask, vf.TasksetConfig]):
    def load(self):
        rng = random.Random(0)
        for i in range(2000):
            ex = calc_example(rng)
            yield CalcTask(CalcData(id=str(i), prompt=ex["prompt"], answer=ex["answer"]), self.config.task)


class CalcEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class CalcToolEnv(vf.Env[CalcEnvConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()  # the prompt opens: the model answers it
            for _ in range(2):
                calls = CALL.findall(segment.last_reply)
                if segment.terminated or not calls:
                    break
                segment = await interaction.turn("\n".join(calc(c) for c in calls))


CalcHub = verifiers_env(CONFIG, name="CalcHub")

__all__ = ["CalcTaskset", "CalcToolEnv"]
