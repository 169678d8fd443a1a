"""A small OpenEnv environment for tests/envs/test_openenv_adapter.py: guess the
secret digit (from ``reset(secret=...)``, else the seed) in at most 3 tries. Run as a
script it serves ``Guess`` with OpenEnv's HTTP/WebSocket server on the listening socket
whose file descriptor it is given."""

from __future__ import annotations

import sys

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    text: str = ""


class Guess(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed=None, episode_id=None, secret=None, **kwargs):
        self.secret = str(secret if secret is not None else (seed or 0) % 10)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(text="guess a digit")

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        if action.guess.strip() == self.secret:
            return GuessObservation(text="right", reward=1.0, done=True, metadata={"tool_calls": 0})
        hint = "higher" if action.guess.strip() < self.secret else "lower"
        return GuessObservation(text=hint, reward=0.0, done=self._state.step_count >= 3)

    @property
    def state(self):
        return self._state


class TwoFields(Action):
    row: int
    col: int


class Board(Environment[TwoFields, GuessObservation, State]):
    """An env whose action has two fields: only a JSON object is an action."""

    def reset(self, seed=None, episode_id=None, **kwargs):
        return GuessObservation(text="pick a cell")

    def step(self, action, timeout_s=None, **kwargs):
        return GuessObservation(text=f"{action.row},{action.col}", reward=float(action.row + action.col), done=True)

    @property
    def state(self):
        return State()


if __name__ == "__main__":
    import uvicorn
    from openenv.core.env_server.http_server import create_fastapi_app

    app = create_fastapi_app(Guess, GuessAction, GuessObservation, max_concurrent_envs=8)
    uvicorn.run(app, fd=int(sys.argv[1]), log_level="warning")
