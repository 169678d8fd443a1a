"""Scorer: the configured reward functions on a batch of rows, decoded.

What the reward role (``actors/reward.py``) does to each batch it takes, and what a
rollout replica does to its own rows right after generating them when
``reward.placement = "rollout"`` (``actors/rollout/actor.py``): decode prompts and
responses, call the functions (``algorithms/rewards.py``: one finite float per row,
a ``RewardError`` naming the function and the row otherwise) and, with an
environment, combine its reward (``env.reward``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from asyncflow.core.phases import phase


def with_env_rewards(rewards: list[float], env_reward: list, env_error: list) -> list[float]:
    """Each row's reward plus its environment's (``rewards`` are zeros with
    ``env.reward = "replace"``); 0 for a row whose environment failed."""
    return [0.0 if int(e[0]) else r + float(er[0]) for r, er, e in zip(rewards, env_reward, env_error)]


def build_reward_fn(functions: list[str], weights: list[float]):
    from asyncflow.algorithms.rewards import load_reward_fn, weighted_sum

    weights = weights or [1.0] * len(functions)
    return weighted_sum(*[(w, load_reward_fn(name)) for w, name in zip(weights, functions)])


class Scorer:
    COLUMNS = ("prompt_ids", "response_ids", "answer", "finish")
    """The columns a row is scored from (``finish``: uint8 [1], 1 for a stop)."""

    def __init__(self, cfg, tokenizer):
        self.tokenizer = tokenizer
        self.env_reward = cfg.env.reward if cfg.env.path else ""  # "", "add" or "replace"
        self.fn = None if self.env_reward == "replace" else build_reward_fn(cfg.reward.functions, cfg.reward.weights)
        self.columns = [*self.COLUMNS, *(("env_reward", "env_error") if self.env_reward else ())]

    def score(self, columns: Mapping[str, Sequence], row_ids: Sequence[int]) -> list[float]:
        """One reward per row of ``columns`` (each of ``self.columns``, a sequence of
        arrays per row); ``row_ids`` name the rows in a reward function's error."""
        from asyncflow.algorithms.rewards import call_reward

        decode = lambda ids: self.tokenizer.decode(ids.tolist(), skip_special_tokens=True)  # noqa: E731
        with phase("detokenize"):
            prompts = [decode(a) for a in columns["prompt_ids"]]
            responses = [decode(a) for a in columns["response_ids"]]
            answers = [bytes(a).decode() for a in columns["answer"]]
            finish = ["stop" if int(f[0]) else "length" for f in columns["finish"]]
        with phase("reward_fn"):
            if self.fn is not None:
                rewards = call_reward(self.fn, prompts, responses, answers, finish, row_ids=list(row_ids))
            else:
                rewards = [0.0] * len(prompts)
        if self.env_reward:
            rewards = with_env_rewards(rewards, list(columns["env_reward"]), list(columns["env_error"]))
        return rewards
