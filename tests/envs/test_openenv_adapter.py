"""OpenEnv environments (openenv-core) as asyncflow environments
(``asyncflow.envs.hub.openenv``): one in this process, one served by OpenEnv's own
HTTP/WebSocket server in another process, and one driven by the tiny model."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv.core", reason="openenv-core is not installed (pip install -e '.[hub]' (in the asyncflow checkout))")

from openenv_guess import Board, Guess  # noqa: E402  (needs openenv)

from asyncflow.envs.base import Action, Sample, load_env_factory  # noqa: E402
from asyncflow.envs.hub.openenv import OpenEnvEnvironment, openenv_env  # noqa: E402

SAMPLE = Sample(prompt="play", prompt_ids=[1, 2], answer="7")


def secret_from_answer(sample: Sample) -> dict:
    return {"secret": sample.answer}


@pytest.mark.timeout(30)
def test_an_in_process_env_maps_observation_reward_and_done_and_takes_the_turn_as_its_one_field():
    env = openenv_env(Guess, reset_kwargs=secret_from_answer)()
    assert env.reset(SAMPLE) == "guess a digit"  # the observation's one text field
    step = env.step(Action(text="3", ids=[]))
    assert (step.observation, step.reward, step.done) == ("higher", 0.0, False)
    step = env.step(Action(text='{"guess": "7"}', ids=[]))  # a JSON object of the action's fields works too
    assert (step.reward, step.done, step.info["tool_calls"]) == (1.0, True, 0)


@pytest.mark.timeout(30)
def test_an_action_of_several_fields_is_a_json_object_and_anything_else_is_answered_not_raised():
    env = openenv_env(Board)()
    env.reset(SAMPLE)
    bad = env.step(Action(text="the middle one", ids=[]))
    assert not bad.done and bad.reward == 0.0 and bad.info["invalid_action"] == 1
    assert "row" in bad.observation and "col" in bad.observation  # says what an action is
    bad = env.step(Action(text='{"row": "x", "col": 1}', ids=[]))
    assert not bad.done and "row" in bad.observation
    ok = env.step(Action(text='```json\n{"row": 1, "col": 2}\n```', ids=[]))
    assert (ok.observation, ok.reward, ok.done) == (None, 3.0, True)


@pytest.mark.timeout(30)
def test_the_env_is_a_zero_argument_factory_for_env_path_and_a_wrong_make_is_refused_with_the_fix():
    assert load_env_factory(f"{__name__}:GuessEnv") is GuessEnv

    class NotOpenEnv(OpenEnvEnvironment):
        def make(self):
            return object()

    with pytest.raises(TypeError, match="openenv.core.Environment"):
        NotOpenEnv().reset(SAMPLE)


GuessEnv = openenv_env(Guess, reset_kwargs=secret_from_answer)


@pytest.fixture
def served():
    """The Guess env served by OpenEnv's server in its own process, on a socket this
    process bound and listens on already (a client's first connect waits in its backlog:
    no polling for readiness)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("openenv_guess.py")), str(sock.fileno())], pass_fds=[sock.fileno()]
    )
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    proc.kill()
    proc.wait()
    sock.close()


@pytest.mark.timeout(90)
def test_a_served_env_is_played_over_openenvs_client_with_its_schema_read_from_the_server(served):
    class Remote(OpenEnvEnvironment):
        base_url = served

        def reset_kwargs(self, sample):
            return {"secret": sample.answer}

    envs = [Remote(), Remote()]  # two sessions at once, each its own env on the server
    assert [e.reset(SAMPLE) for e in envs] == ["guess a digit", "guess a digit"]
    assert envs[0].step(Action(text="9", ids=[])).observation == "lower"
    step = envs[1].step(Action(text="7", ids=[]))
    assert (step.reward, step.done) == (1.0, True)
    step = envs[0].step(Action(text="7", ids=[]))
    assert (step.reward, step.done) == (1.0, True)


@pytest.mark.timeout(120)
def test_the_driver_runs_an_openenv_env_with_the_tiny_model(tiny_dir, tokenizer):
    from asyncflow.actors.rollout.multiturn import MultiTurnDriver
    from asyncflow.config.env import EnvConfig
    from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
    from asyncflow.engines.native_rollout import NativeRolloutEngine
    from asyncflow.engines.prompts import encode_chat_prompt

    engine = NativeRolloutEngine(RolloutEngineConfig(max_batch_size=16, seed=0), tiny_dir)
    driver = MultiTurnDriver(EnvConfig(path="x:y", max_turns=5), tokenizer, factory=GuessEnv)
    samples = [Sample(prompt=f"{i}=", prompt_ids=encode_chat_prompt(tokenizer, f"{i}="), answer=str(i)) for i in range(4)]
    try:
        trajs = driver.run(engine, SamplingParams(max_new_tokens=3, stop_token_ids=(tokenizer.eos_token_id,)), samples)
    finally:
        driver.close()
    for t in trajs:
        assert not t.error and 1 <= t.turns <= 3 and t.finished  # right, or out of tries: the env said done
        assert t.reward in (0.0, 1.0)
