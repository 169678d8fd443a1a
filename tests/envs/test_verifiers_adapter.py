"""verifiers (v1) environments as asyncflow environments (``asyncflow.envs.hub.verifiers``):
a taskset's tasks as the run's data, the Env's own ``run()`` driving the exchange with
the policy in its seat, the task's rewards and the env's on the trace as the reward."""

from __future__ import annotations

import gc
import json

import pytest

pytest.importorskip("verifiers.v1", reason="verifiers is not installed (pip install -e '.[hub]' (in the asyncflow checkout))")

from asyncflow.envs.base import Action, Sample, load_env_factory  # noqa: E402
from asyncflow.envs.hub.verifiers import task_rows, verifiers_env, write_data  # noqa: E402

Digits = verifiers_env({"taskset": {"id": "vf_digits"}})
Guessing = verifiers_env({"taskset": {"id": "vf_guessing"}})


def sample_of(row: dict) -> Sample:
    return Sample(prompt=row["prompt"], prompt_ids=[1], answer=row["answer"])


@pytest.mark.timeout(60)
def test_a_prompted_task_is_answered_by_one_turn_and_scored_by_its_task_reward():
    rows = task_rows({"taskset": {"id": "vf_digits"}})
    assert len(rows) == 10 and rows[3]["prompt"] == "digits only\n\nsay 3"  # the system prompt folded in
    right, wrong = Digits(), Digits()
    assert right.reset(sample_of(rows[3])) is None and wrong.reset(sample_of(rows[3])) is None  # the prompt opens
    step = right.step(Action(text=" 3", ids=[5]))
    assert (step.reward, step.done, step.observation) == (1.0, True, None)
    assert step.info["verifiers_rewards"] == {"correct": 1.0}
    assert wrong.step(Action(text="4", ids=[5])).reward == 0.0


@pytest.mark.timeout(60)
def test_an_env_that_opens_the_exchange_answers_each_turn_until_its_run_ends():
    row = task_rows({"taskset": {"id": "vf_guessing"}})[1]  # secret 3
    env = Guessing()
    assert env.reset(sample_of(row)) == "guess my number, 0..9 (guess#1)"
    step = env.step(Action(text="1", ids=[]))
    assert (step.observation, step.reward, step.done) == ("higher", 0.0, False)
    step = env.step(Action(text="3", ids=[]))
    assert step.done and step.reward == pytest.approx(1.0 + 0.5)  # the game's reward + the task's (weight 0.5)
    slow = Guessing()
    slow.reset(sample_of(row))
    for guess in "0", "1":
        slow.step(Action(text=guess, ids=[]))
    assert slow.step(Action(text="3", ids=[])).reward == pytest.approx(1.0)  # won, but not quickly


@pytest.mark.timeout(60)
def test_a_trajectory_asyncflow_stops_early_ends_its_episode_thread_once_dropped():
    env = Guessing()
    env.reset(sample_of(task_rows({"taskset": {"id": "vf_guessing"}})[0]))
    env.step(Action(text="9", ids=[]))  # env.max_turns reached: the driver calls nothing more
    thread = env.thread
    del env
    gc.collect()
    thread.join(timeout=30)
    assert not thread.is_alive()


@pytest.mark.timeout(60)
def test_data_is_written_once_and_an_answer_that_is_no_task_key_is_refused_with_the_fix(tmp_path):
    path = write_data({"taskset": {"id": "vf_digits"}}, tmp_path / "data.jsonl", limit=4)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["prompt"].split()[-1] for r in rows] == ["0", "1", "2", "3"]
    with pytest.raises(KeyError, match="write_data"):
        Digits().reset(Sample(prompt="say 3", prompt_ids=[1], answer="3"))


@pytest.mark.timeout(60)
def test_the_env_is_a_zero_argument_factory_for_env_path_and_a_missing_taskset_is_refused_with_the_key():
    assert load_env_factory(f"{__name__}:Digits") is Digits
    Nowhere = verifiers_env({"taskset": {"id": "no_such_taskset_here"}})
    with pytest.raises(ValueError, match="taskset.id"):
        Nowhere().reset(Sample(prompt="", prompt_ids=[1], answer="x"))


@pytest.mark.timeout(120)
def test_the_driver_runs_a_verifiers_task_with_the_tiny_model(tiny_dir, tokenizer):
    from asyncflow.actors.rollout.multiturn import MultiTurnDriver
    from asyncflow.config.env import EnvConfig
    from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
    from asyncflow.engines.native_rollout import NativeRolloutEngine
    from asyncflow.engines.prompts import encode_chat_prompt

    engine = NativeRolloutEngine(RolloutEngineConfig(max_batch_size=16, seed=0), tiny_dir)
    driver = MultiTurnDriver(EnvConfig(path="x:y", max_turns=3), tokenizer, factory=Guessing)
    rows = task_rows({"taskset": {"id": "vf_guessing"}})
    samples = [
        Sample(prompt=r["prompt"], prompt_ids=encode_chat_prompt(tokenizer, r["prompt"]), answer=r["answer"]) for r in rows
    ]
    try:
        trajs = driver.run(engine, SamplingParams(max_new_tokens=3, stop_token_ids=(tokenizer.eos_token_id,)), samples)
    finally:
        driver.close()
    for t in trajs:
        assert not t.error and 1 <= t.turns <= 3
        assert t.mask[0] == 0  # the env's opening message comes first, out of the loss
        assert t.reward >= 1.0 if t.finished else t.turns == 3  # a win ends it; else the turn limit did
