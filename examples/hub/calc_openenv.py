"""The calculator task as an OpenEnv environment (openenv-core), played through
asyncflow's OpenEnv adapter (``asyncflow.envs.hub.openenv``): examples/hub/hub.toml.

``Calculator`` is a plain OpenEnv environment, written against OpenEnv's interface
only: ``reset(question=, answer=)``, then each ``step`` takes the model's turn as a
``CalcAction``. A turn ``<calc>37*48</calc>`` gets the result as the observation
(``metadata["tool_calls"]`` 1); any other turn is the final answer, reward 1 when it is
the product, and ends the episode. The same class can be served by OpenEnv's own
server (``create_fastapi_app(Calculator, CalcAction, CalcObservation)``) and played
with ``base_url`` instead (``CalcHubServed``).

``CalcHub`` is what ``env.path`` names: the adapter, making one ``Calculator`` per
trajectory and resetting it with the prompt and the dataset's answer.
"""

from __future__ import annotations

import os
import re

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from asyncflow.envs.calc import calc
from asyncflow.envs.hub.openenv import OpenEnvEnvironment, openenv_env

CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)


class CalcAction(Action):
    text: str


class CalcObservation(Observation):
    text: str = ""


class Calculator(Environment[CalcAction, CalcObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed=None, episode_id=None, question: str = "", answer: str = "", **kwargs):
        self.answer = answer
        self._state = State(episode_id=episode_id, step_count=0)
        return CalcObservation()  # the question is the prompt already: nothing to add

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        calls = CALL.findall(action.text)
        if calls:
            return CalcObservation(text="\n".join(calc(c) for c in calls), reward=0.0, metadata={"tool_calls": len(calls)})
        return CalcObservation(reward=float(action.text.strip() == self.answer), done=True, metadata={"tool_calls": 0})

    @property
    def state(self):
        return self._state


def _reset_kwargs(sample):
    return {"question": sample.prompt, "answer": sample.answer}


CalcHub = openenv_env(Calculator, reset_kwargs=_reset_kwargs, name="CalcHub")


class CalcHubServed(OpenEnvEnvironment):
    """The same environment served by OpenEnv's server at ``$CALC_OPENENV_URL``."""

    base_url = os.environ.get("CALC_OPENENV_URL", "")

    def reset_kwargs(self, sample):
        return _reset_kwargs(sample)
