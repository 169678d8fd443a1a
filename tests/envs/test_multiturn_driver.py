"""The multi-turn driver with a real tiny model: exact token ids and loss mask,
per-turn rewards, errors and timeouts kept to their trajectory, and a slow
environment step that does not hold the other trajectories back."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from asyncflow.actors.rollout.multiturn import MultiTurnDriver
from asyncflow.config.env import EnvConfig
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
from asyncflow.engines.native_rollout import NativeRolloutEngine
from asyncflow.engines.prompts import encode_chat_prompt
from asyncflow.envs.base import Action, Environment, Sample, Step
from asyncflow.envs.render import observation_ids

OBS_IDS = [7, 8, 9]  # observation given as ids: inserted as is
RELEASE = threading.Event()  # lets the hanging step return once its test is over
FAST_DONE = threading.Event()


class Scripted(Environment):
    """Behaviour by ``sample.answer``: ``text``/``ids`` (3 turns, observations as text or
    ids, reward 0.5, 0.5, then 1 at done), ``raise``, ``hang``, ``slow`` (its first step
    waits until a ``fast`` trajectory took its third turn), ``fast``."""

    def reset(self, sample: Sample):
        self.kind, self.n = sample.answer, 0
        return None

    def step(self, action: Action) -> Step:
        self.n += 1
        if self.kind == "raise":
            raise RuntimeError("the tool exploded")
        if self.kind == "hang":
            RELEASE.wait(timeout=60)
        if self.kind == "slow" and self.n == 1:
            assert FAST_DONE.wait(timeout=60), "the fast trajectories never reached their third turn"
        if self.kind == "fast" and self.n == 3:
            FAST_DONE.set()
        if self.n >= 3:
            return Step(reward=1.0, done=True)
        if self.kind == "huge" and self.n == 2:  # after a cut that filled the context: no room left at all
            return Step(observation="y" * 2_000_000, reward=0.5)
        if self.kind in ("big", "huge"):  # a tool that returns 2 MB of text, then as many ids
            return Step(observation="x" * 2_000_000 if self.n == 1 else [7] * 2_000_000, reward=0.5)
        return Step(observation=OBS_IDS if self.kind == "ids" else f"ok{self.n}", reward=0.5, info={"tool_calls": 1})


class Recording(NativeRolloutEngine):
    """The native engine, keeping what each generate call was given and gave back."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[list[list[int]], list]] = []

    def generate(self, prompts, params):
        out = super().generate(prompts, params)
        self.calls.append(([list(p) for p in prompts], out))
        return out


@pytest.fixture(scope="module")
def engine(tiny_dir):
    return Recording(RolloutEngineConfig(max_batch_size=64, seed=0), tiny_dir)


def run(engine, tokenizer, kinds, **env):
    cfg = EnvConfig(path="x:y", **env)
    driver = MultiTurnDriver(cfg, tokenizer, factory=Scripted)
    engine.calls.clear()
    prompts = [f"{i}+{i}=" for i in range(len(kinds))]  # distinct, so a test can tell the trajectories' turns apart
    samples = [Sample(prompt=p, prompt_ids=encode_chat_prompt(tokenizer, p), answer=k) for p, k in zip(prompts, kinds)]
    params = SamplingParams(max_new_tokens=4, stop_token_ids=(tokenizer.eos_token_id,), n=8)
    try:
        return driver, driver.run(engine, params, samples)
    finally:
        driver.close()


def test_a_trajectory_holds_the_exact_ids_of_each_turn_and_observation_with_the_loss_mask_on_model_tokens(engine, tokenizer):
    driver, trajs = run(engine, tokenizer, ["text", "ids"], discount=0.5)
    # replay the generate calls: each trajectory's turns, in order, as the engine gave them
    turns: dict[int, list] = {0: [], 1: []}
    for prompts, outs in engine.calls:
        for prompt, c in zip(prompts, outs):
            b = next(b for b, t in enumerate(trajs) if prompt == t.prompt_ids + t.ids[: len(prompt) - len(t.prompt_ids)])
            turns[b].append((prompt, c))
    for b, t in enumerate(trajs):
        assert len(turns[b]) == 3 and t.turns == 3 and t.finished and not t.error
        expected_ids, expected_mask, expected_logp = [], [], []
        for k, (prompt, c) in enumerate(turns[b]):
            assert prompt == t.prompt_ids + expected_ids  # the next turn sees the ids so far, not a re-tokenised text
            expected_ids += c.response_ids
            expected_mask += [1] * len(c.response_ids)
            expected_logp += c.logprobs
            if k < 2:
                obs = OBS_IDS if b == 1 else observation_ids(tokenizer, f"ok{k + 1}")
                expected_ids += obs
                expected_mask += [0] * len(obs)
                expected_logp += [0.0] * len(obs)
        cols = t.columns()
        assert cols["response_ids"].tolist() == expected_ids
        assert cols["loss_mask"].tolist() == expected_mask
        np.testing.assert_array_equal(cols["rollout_logp"], np.asarray(expected_logp, dtype=np.float32))
        assert cols["env_reward"][0] == pytest.approx(0.5 + 0.5 * 0.5 + 1.0 * 0.25)  # discounted per turn
        assert (cols["finish"][0], cols["env_error"][0], cols["env_tool_calls"][0]) == (1, 0, 2)
    assert tokenizer.decode(observation_ids(tokenizer, "ok1")) == "<|user|>ok1<|assistant|>"


def test_an_observation_over_its_limit_is_cut_with_a_marker_before_it_is_tokenised(engine, tokenizer):
    driver, (t,) = run(engine, tokenizer, ["big"], max_observation_chars=200)
    observed = [i for i, m in zip(t.ids, t.mask) if m == 0]
    text = tokenizer.decode(observed[: len(observed) - 200])  # the text observation (the ids one follows)
    assert text.split("[")[0].count("x") == 200 and "[observation cut: 2000000 chars, env.max_observation_chars = 200]" in text
    assert observed[-200:] == [7] * 200 and len(observed) < 500  # 2 MB each, kept to the limit (+ the marker)
    assert t.finished and driver.stats.observations_cut == 2


def test_an_observation_is_cut_in_tokens_to_what_the_context_has_left_with_a_marker_the_model_sees(engine, tokenizer):
    limit, new = 300, 4  # env.max_context_tokens, and the run's max_new_tokens (run() above)
    driver, (t,) = run(engine, tokenizer, ["big"], max_context_tokens=limit)
    assert len(t.prompt_ids) + len(t.ids) <= limit
    first = t.mask.index(0)  # the first observation follows the first turn
    end = t.mask.index(1, first)
    text = tokenizer.decode(t.ids[first:end])
    assert "[observation cut to fit the context" in text and "env.max_context_tokens = 300" in text, text
    assert text.count("x") > 100  # as much of the result as fits, not a fixed few characters
    assert len(t.prompt_ids) + end + new <= limit  # the next turn fits after it
    assert driver.stats.observations_cut >= 1 and not t.finished


def test_an_observation_with_no_room_left_ends_the_trajectory_instead_of_the_run(engine, tokenizer):
    driver, (t,) = run(engine, tokenizer, ["huge"], max_context_tokens=300)
    assert len(t.prompt_ids) + len(t.ids) <= 300 and not t.error and not t.finished
    assert t.mask[-1] == 1 or "[observation cut" in tokenizer.decode(t.ids[-80:])


def test_the_model_context_bounds_a_trajectory_without_max_context_tokens(engine, tokenizer):
    cfg = EnvConfig(path="x:y")
    driver = MultiTurnDriver(cfg, tokenizer, factory=Scripted, context_tokens=512)  # the model's positions
    samples = [Sample(prompt="1+1=", prompt_ids=encode_chat_prompt(tokenizer, "1+1="), answer="big")]
    params = SamplingParams(max_new_tokens=4, stop_token_ids=(tokenizer.eos_token_id,))
    try:
        (t,) = driver.run(engine, params, samples)  # no "exceeds max_position_embeddings" error from the engine
    finally:
        driver.close()
    assert len(t.prompt_ids) + len(t.ids) <= 512 and "context of 512 tokens" in tokenizer.decode(t.ids)


def test_the_turn_limit_ends_a_trajectory_unfinished(engine, tokenizer):
    _, (t,) = run(engine, tokenizer, ["text"], max_turns=2)
    assert (t.turns, t.finished, t.error) == (2, False, "")
    assert t.columns()["finish"][0] == 0 and t.columns()["env_reward"][0] == pytest.approx(1.0)
    assert t.columns()["loss_mask"].tolist()[-1] == 1  # nothing inserted after the last turn


def test_a_raising_tool_ends_its_trajectory_with_an_error_and_reward_0_and_the_others_go_on(engine, tokenizer):
    driver, trajs = run(engine, tokenizer, ["raise", "text", "text"])
    bad = trajs[0].columns()
    assert "RuntimeError: the tool exploded" in trajs[0].error
    assert (bad["env_error"][0], bad["env_reward"][0], bad["finish"][0]) == (1, 0.0, 0)
    assert all(t.finished and not t.error and t.columns()["env_reward"][0] == pytest.approx(2.0) for t in trajs[1:])
    assert driver.stats.errors == 1


def test_a_hanging_tool_times_out_with_an_error_and_the_others_go_on(engine, tokenizer):
    RELEASE.clear()
    try:
        driver, trajs = run(engine, tokenizer, ["hang", "text"], step_timeout_s=1.0)
    finally:
        RELEASE.set()
    assert "timed out after 1 s (env.step_timeout_s)" in trajs[0].error
    assert trajs[0].columns()["env_error"][0] == 1 and trajs[0].columns()["env_reward"][0] == 0.0
    assert trajs[1].finished and not trajs[1].error
    assert driver.stats.timeouts == 1


def test_a_slow_environment_step_does_not_stop_the_engine_from_driving_the_other_trajectories(engine, tokenizer):
    """The slow trajectory's first step waits until the fast ones took their third (last)
    turn: a driver that waited for every step of a round before the next generate call
    would never get there (the step times out and fails the trajectory)."""
    FAST_DONE.clear()
    driver, trajs = run(engine, tokenizer, ["slow", "fast", "fast"], step_timeout_s=30.0)
    assert all(t.finished and not t.error for t in trajs), [t.error for t in trajs]
    assert driver.stats.max_pending >= 1  # the engine generated while the slow step was in flight
    first_turns = [len(prompts) for prompts, _ in engine.calls]
    # the fast ones went on alone: no later call waited for the slow one (how the fast ones' own
    # steps, run in threads, pair up into calls is the scheduler's: [2, 2, ...] or [2, 1, 1, ...])
    assert first_turns[0] == 3 and all(n <= 2 for n in first_turns[1:])


HUNG_PROCESS = """
import threading
from asyncflow.actors.rollout.multiturn import MultiTurnDriver
from asyncflow.config.env import EnvConfig
from asyncflow.envs.base import Environment, Step

class Hung(Environment):
    def reset(self, sample):
        return None

    def step(self, action):
        threading.Event().wait()  # never returns

driver = MultiTurnDriver(EnvConfig(path="x:y"), tokenizer=None, factory=Hung)
driver.pool.submit(Hung().step, None)  # a call that never returns, on the driver's pool
driver.close()
print("exiting", flush=True)
"""


def test_a_hung_environment_call_does_not_hold_the_process_at_exit(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "hung.py"
    script.write_text(HUNG_PROCESS)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "exiting" in done.stdout, done.stderr


class Closing(Scripted):
    """Scripted, recording its ``close`` (``CLOSED``: the kinds closed, under ``CLOSING``)."""

    def close(self) -> None:
        with CLOSING:
            CLOSED.append(self.kind)
            CLOSING.notify_all()
        if self.kind == "raise":
            raise OSError("the sandbox was already gone")


CLOSED: list[str] = []
CLOSING = threading.Condition()


def test_every_trajectory_that_ended_is_closed_once_on_the_pool_except_one_whose_call_hung(engine, tokenizer):
    """Done, the turn limit, an error: each environment's close() runs once, off the engine's
    thread; one whose step timed out is never closed (it may still be inside the step), and a
    close that raises is counted, not fatal."""
    CLOSED.clear()
    RELEASE.clear()
    cfg = EnvConfig(path="x:y", step_timeout_s=1.0, max_turns=2)
    driver = MultiTurnDriver(cfg, tokenizer, factory=Closing)
    submitted: list[str] = []
    submit = driver.pool.submit

    def spy(fn, *args):  # which environments the driver hands a close to (decided in end(), before run returns)
        if getattr(fn, "__name__", "") == "_close":
            submitted.append(args[0].kind)
        return submit(fn, *args)

    driver.pool.submit = spy
    kinds = ["text", "raise", "hang", "ids"]
    samples = [
        Sample(prompt=f"{i}+{i}=", prompt_ids=encode_chat_prompt(tokenizer, f"{i}+{i}="), answer=k) for i, k in enumerate(kinds)
    ]
    try:
        trajs = driver.run(engine, SamplingParams(max_new_tokens=4, stop_token_ids=(tokenizer.eos_token_id,)), samples)
        assert [t.hung for t in trajs] == [False, False, True, False]
        assert sorted(submitted) == ["ids", "raise", "text"]  # the hung one is not handed over
        with CLOSING:
            assert CLOSING.wait_for(lambda: len(CLOSED) == 3, timeout=30), CLOSED
        assert sorted(CLOSED) == ["ids", "raise", "text"]
        with CLOSING:
            assert CLOSING.wait_for(lambda: driver.stats.close_errors == 1, timeout=30)
    finally:
        RELEASE.set()
        driver.close()
