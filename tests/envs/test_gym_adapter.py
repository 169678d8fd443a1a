"""The gymnasium-style text adapter (``asyncflow.envs.gym``): any object with
``reset(seed, options) -> (obs, info)`` and ``step(text) -> (obs, reward, terminated,
truncated, info)`` runs as an asyncflow environment; no extra installed. The last
test drives one through the multi-turn driver with the real tiny model."""

from __future__ import annotations

import gc

import pytest

from asyncflow.envs.base import Action, Environment, Sample, load_env_factory
from asyncflow.envs.gym import GymTextEnvironment, gym_env


class Guess:
    """A text game with the gymnasium API: guess the secret digit in at most 3 tries.
    The secret comes from the seed (or ``options["secret"]``)."""

    instances: list[Guess] = []

    def __init__(self):
        self.closed = False
        Guess.instances.append(self)

    def reset(self, *, seed=None, options=None):
        self.secret = str((options or {}).get("secret", (seed or 0) % 10))
        self.tries = 0
        return "guess a digit", {"seed": seed}

    def step(self, action: str):
        self.tries += 1
        if action.strip() == self.secret:
            return "right", 1.0, True, False, {"tool_calls": 0}
        return ("higher" if action.strip() < self.secret else "lower"), 0.0, False, self.tries >= 3, {}

    def close(self):
        self.closed = True


SAMPLE = Sample(prompt="play", prompt_ids=[1, 2, 3], answer="")


@pytest.mark.timeout(30)
def test_reset_and_step_map_the_gymnasium_tuple_onto_observation_reward_and_done():
    Env = gym_env(Guess, options=lambda sample: {"secret": "7"})
    env = Env()
    assert env.reset(SAMPLE) == "guess a digit"
    step = env.step(Action(text="3", ids=[]))
    assert (step.observation, step.reward, step.done) == ("higher", 0.0, False)
    step = env.step(Action(text=" 7 ", ids=[]))
    assert (step.reward, step.done, step.info["tool_calls"]) == (1.0, True, 0)
    assert Guess.instances[-1].closed  # done: the wrapped env is closed


@pytest.mark.timeout(30)
def test_truncation_ends_the_trajectory_and_says_so_in_info():
    env = gym_env(Guess, options=lambda sample: {"secret": "9"})()
    env.reset(SAMPLE)
    steps = [env.step(Action(text="0", ids=[])) for _ in range(3)]
    assert [s.done for s in steps] == [False, False, True]
    assert steps[-1].info["truncated"] is True and steps[-1].reward == 0.0


@pytest.mark.timeout(30)
def test_a_trajectory_dropped_before_done_closes_its_env():
    env = gym_env(Guess, options=lambda sample: {"secret": "9"})()
    env.reset(SAMPLE)
    env.step(Action(text="0", ids=[]))  # env.max_turns reached: the driver calls nothing more
    game = env.env
    del env
    gc.collect()
    assert game.closed


@pytest.mark.timeout(30)
def test_the_seed_follows_the_prompt_so_a_group_shares_its_start_and_prompts_differ():
    Env = gym_env(Guess)
    a, b = Env(), Env()
    a.reset(SAMPLE)
    b.reset(SAMPLE)
    assert a.env.secret == b.env.secret  # one prompt, one start: a GRPO group compares like with like
    seeds = set()
    for i in range(20):
        env = Env()
        env.reset(Sample(prompt=f"play {i}", prompt_ids=[i], answer=""))
        seeds.add(env.env.secret)
    assert len(seeds) > 1


@pytest.mark.timeout(30)
def test_a_subclass_names_its_env_by_make_and_is_a_zero_argument_factory_for_env_path():
    class MyGame(GymTextEnvironment):
        def make(self):
            return Guess()

    assert issubclass(MyGame, Environment)
    MyGame().reset(SAMPLE)  # the probe load_env_factory makes builds nothing until reset
    assert load_env_factory(f"{__name__}:Loadable") is Loadable


class Loadable(GymTextEnvironment):
    def make(self):
        return Guess()


@pytest.mark.timeout(30)
def test_an_env_without_the_five_tuple_step_is_refused_with_what_to_return():
    class OldGym:
        def reset(self, *, seed=None, options=None):
            return "start", {}

        def step(self, action):
            return "obs", 1.0, True, {}  # the old gym 4-tuple

    env = gym_env(OldGym)()
    env.reset(SAMPLE)
    with pytest.raises(TypeError, match=r"\(obs, reward, terminated, truncated, info\)"):
        env.step(Action(text="x", ids=[]))

    class NoReset:
        def step(self, action):
            return "", 0.0, True, False, {}

    with pytest.raises(TypeError, match="reset"):
        gym_env(NoReset)().reset(SAMPLE)


@pytest.mark.timeout(30)
def test_a_gymnasium_env_runs_as_is():
    gymnasium = pytest.importorskip(
        "gymnasium", reason="gymnasium is not installed (pip install -e '.[hub]' (in the asyncflow checkout))"
    )
    from gymnasium import spaces

    class Echo(gymnasium.Env):
        observation_space = spaces.Text(64)
        action_space = spaces.Text(64)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.word = str(self.np_random.integers(0, 10))
            return f"say {self.word}", {}

        def step(self, action):
            right = action.strip() == self.word
            return ("yes" if right else "no"), float(right), right, False, {}

    env = gym_env(Echo)()
    obs = env.reset(SAMPLE)
    assert obs.startswith("say ")
    assert env.step(Action(text=obs.split()[1], ids=[])).reward == 1.0


@pytest.mark.timeout(120)
def test_the_driver_runs_a_gym_text_env_with_the_tiny_model(tiny_dir, tokenizer):
    from asyncflow.actors.rollout.multiturn import MultiTurnDriver
    from asyncflow.config.env import EnvConfig
    from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
    from asyncflow.engines.native_rollout import NativeRolloutEngine
    from asyncflow.engines.prompts import encode_chat_prompt
    from asyncflow.envs.render import observation_ids

    engine = NativeRolloutEngine(RolloutEngineConfig(max_batch_size=16, seed=0), tiny_dir)
    driver = MultiTurnDriver(EnvConfig(path="x:y", max_turns=5), tokenizer, factory=gym_env(Guess))
    samples = [Sample(prompt=f"{i}=", prompt_ids=encode_chat_prompt(tokenizer, f"{i}="), answer="") for i in range(4)]
    try:
        trajs = driver.run(engine, SamplingParams(max_new_tokens=3, stop_token_ids=(tokenizer.eos_token_id,)), samples)
    finally:
        driver.close()
    start = observation_ids(tokenizer, "guess a digit")
    for t in trajs:
        assert not t.error and 1 <= t.turns <= 3  # right, or truncated by the game after 3 tries
        assert t.finished  # the game said done (terminated or truncated), not env.max_turns
        assert t.ids[: len(start)] == start and t.mask[: len(start)] == [0] * len(start)  # reset's observation, out of the loss
