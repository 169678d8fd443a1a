"""Multi-turn trajectories in a partial-rollout stream (actors/rollout/multiturn.py,
``TurnStream``) with the real tiny model: every token records the version that
produced it when weights swap in the middle of a turn and while the environment
steps; unit mode records one version per trajectory. The swaps are ordered by
events (the environment's step waits for the test), never by sleeps."""

from __future__ import annotations

import threading

import msgspec
import pytest
import torch

from asyncflow.actors.rollout.multiturn import MultiTurnDriver, TurnStream
from asyncflow.config.env import EnvConfig
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
from asyncflow.engines.native_rollout import NativeRolloutEngine
from asyncflow.envs.base import Action, Environment, Sample, Step

RESET_OBS = [7, 8]  # an observation before the first turn, as ids (inserted as is)
TOOL_OBS = [9, 10, 11]
TURN = 6  # tokens per turn: no stop token, every turn is max_new_tokens long


class Gated(Environment):
    """Two turns; the first step tells the test it is running (``STEPPING``) and
    returns its observation only once the test says so (``RELEASE``)."""

    STEPPING = threading.Event()
    RELEASE = threading.Event()

    def reset(self, sample: Sample):
        self.n = 0
        return RESET_OBS

    def step(self, action: Action) -> Step:
        self.n += 1
        if self.n == 1:
            Gated.STEPPING.set()
            assert Gated.RELEASE.wait(timeout=60), "the test never released the environment's step"
            return Step(observation=TOOL_OBS, reward=0.5, info={"tool_calls": 1})
        return Step(reward=0.5, done=True)


@pytest.fixture
def engine(tiny_dir):
    torch.set_num_threads(1)
    return NativeRolloutEngine(RolloutEngineConfig(max_batch_size=8, seed=0), tiny_dir, version=0)


def _weights(engine: NativeRolloutEngine, seed: int) -> list[tuple[str, torch.Tensor]]:
    """The engine's weights with noise: another policy version."""
    g = torch.Generator().manual_seed(seed)
    return [(n, t.detach().float() + 0.05 * torch.randn(t.shape, generator=g)) for n, t in engine.model.named_parameters()]


def _driver(tokenizer) -> MultiTurnDriver:
    Gated.STEPPING.clear()
    Gated.RELEASE.clear()
    return MultiTurnDriver(EnvConfig(path="x:y", max_turns=3, step_timeout_s=60.0), tokenizer, factory=Gated)


def _params(tokenizer) -> SamplingParams:
    return SamplingParams(max_new_tokens=TURN, stop_token_ids=(), n=1, seed=3)


@pytest.mark.timeout(120)
def test_a_trajectory_whose_turns_span_two_swaps_records_each_tokens_version(engine, tokenizer):
    driver = _driver(tokenizer)
    stream = engine.open_stream(_params(tokenizer), max_running=4)
    turns = TurnStream(driver, stream, TURN, lambda: engine.version)
    prompt = tokenizer.encode("3+4=")
    (traj,) = turns.add([Sample(prompt="3+4=", prompt_ids=prompt, answer="7")])
    ended = []
    try:
        while stream.num_active == 0:  # the reset comes back, the first turn joins: prefill (token 0) + a decode (token 1)
            ended += turns.step(wait_s=1.0)
        engine.load_weights(_weights(engine, 1), version=1)  # mid-turn: tokens 2.. of turn 1 from v1
        while not Gated.STEPPING.is_set():  # turn 1 ends, its step starts (and waits for the test)
            ended += turns.step(wait_s=1.0)
        engine.load_weights(_weights(engine, 2), version=2)  # while the environment steps
        Gated.RELEASE.set()
        while turns.num_live:
            ended += turns.step(wait_s=1.0)
    finally:
        Gated.RELEASE.set()
        stream.close()
        driver.close()
    assert ended == [traj] and traj.done and traj.finished and traj.turns == 2
    # the observation before turn 1 takes that turn's first version; the tool's, the version before it
    expected = [0] * len(RESET_OBS) + [0, 0] + [1] * (TURN - 2) + [1] * len(TOOL_OBS) + [2] * TURN
    assert traj.versions == expected
    assert traj.mask == [0] * len(RESET_OBS) + [1] * TURN + [0] * len(TOOL_OBS) + [1] * TURN
    assert traj.ids[: len(RESET_OBS)] == RESET_OBS and traj.ids[len(RESET_OBS) + TURN :][: len(TOOL_OBS)] == TOOL_OBS
    row = traj.columns(token_versions=True)
    assert row["token_versions"].tolist() == expected and row["token_versions"].dtype.name == "int32"
    assert len(row["token_versions"]) == len(row["response_ids"]) == len(row["rollout_logp"])
    assert engine.pool.used_bytes == 0  # every turn's KV freed


@pytest.mark.timeout(120)
def test_a_trajectory_that_ends_before_its_first_turn_is_dated_with_the_version_held(engine, tokenizer):
    driver = MultiTurnDriver(EnvConfig(path="x:y", max_context_tokens=4), tokenizer, factory=Gated)
    stream = engine.open_stream(_params(tokenizer), max_running=4)
    engine.load_weights(_weights(engine, 1), version=5)
    turns = TurnStream(driver, stream, TURN, lambda: engine.version)
    (traj,) = turns.add([Sample(prompt="3+4=", prompt_ids=tokenizer.encode("3+4="), answer="7")])
    try:
        ended: list = []
        while not ended:  # no room under max_context_tokens, not even for the reset's observation: it ends at once
            ended = turns.step(wait_s=1.0)
    finally:
        stream.close()
        driver.close()
    assert traj.turns == 0 and not traj.finished and traj.ids and traj.versions == [5] * len(traj.ids)


@pytest.mark.timeout(120)
def test_a_unit_records_its_one_version_on_every_token(engine, tokenizer):
    driver = _driver(tokenizer)
    Gated.RELEASE.set()
    params = msgspec.structs.replace(_params(tokenizer), n=4)
    try:
        (traj,) = driver.run(engine, params, [Sample(prompt="3+4=", prompt_ids=tokenizer.encode("3+4="), answer="7")])
    finally:
        driver.close()
    assert traj.turns == 2 and traj.versions == [0] * len(traj.ids)
    assert "token_versions" not in traj.columns()  # unit mode's rows: no column (the row's version says it)
