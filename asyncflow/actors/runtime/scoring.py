"""Scorer: the configured reward functions on a batch of rows, decoded.

What the reward role (``actors/roles/reward.py``) does to each batch it takes, and what a
rollout replica does to its own rows right after generating them when
``reward.placement = "rollout"`` (``actors/rollout/actor.py``): decode prompts and
responses, call the functions (``algorithms/rewards.py``: one finite float per row,
a ``RewardError`` naming the function and the row otherwise; a call past
``reward.timeout_s`` gives its rows 0, logged) and, with an environment, combine its
reward (``env.reward``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncflow.core.phases import phase

log = logging.getLogger(__name__)


def within(seconds: float, call: Callable[[], Any]) -> tuple[bool, Any]:
    """``(True, call())`` when it returns (or raises) within ``seconds``; ``(False,
    None)`` past them. The call runs in a daemon thread that a hung call keeps: it can
    be left behind, never waited for, and never holds the process's exit."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="reward-fn", daemon=True).start()
    if not done.wait(seconds):
        return False, None
    if "error" in box:
        raise box["error"]
    return True, box["value"]


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
        self.functions = list(cfg.reward.functions)
        self.timeout_s = cfg.reward.timeout_s
        self.timed_out_rows = 0
        """Rows scored 0 because their call passed ``reward.timeout_s``."""

    def reward_column(
        self, prompt_ids: Sequence, answers: Sequence, generated: Mapping[str, Sequence], row_ids: Sequence[int]
    ) -> list[np.ndarray]:
        """``reward`` (float32 [1] per row) of freshly generated rows, as a rollout replica puts it
        (``reward.placement = "rollout"``): ``generated`` holds their ``response_ids`` and ``finish``."""
        scored = {
            "prompt_ids": prompt_ids,
            "answer": answers,
            "response_ids": generated["response_ids"],
            "finish": generated["finish"],
        }
        return [np.asarray([r], dtype=np.float32) for r in self.score(scored, row_ids)]

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
                fn = self.fn

                def call() -> list[float]:
                    return call_reward(fn, prompts, responses, answers, finish, row_ids=list(row_ids))

                returned, rewards = within(self.timeout_s, call) if self.timeout_s > 0 else (True, call())
                if not returned:
                    self.timed_out_rows += len(prompts)
                    log.warning(
                        "the reward functions %s did not return within reward.timeout_s = %g s for rows %s: they get "
                        "reward 0 (%d rows so far); the call is left running",
                        self.functions,
                        self.timeout_s,
                        list(row_ids),
                        self.timed_out_rows,
                    )
                    rewards = [0.0] * len(prompts)
            else:
                rewards = [0.0] * len(prompts)
        if self.env_reward:
            rewards = with_env_rewards(rewards, list(columns["env_reward"]), list(columns["env_error"]))
        return rewards


def env_sums(columns: dict[str, list]) -> list[float]:
    """This rank's sums of the environment figures: rows with a tool call, tool
    calls, rows whose environment failed, env reward, model (loss) tokens."""
    calls = [int(c[0]) for c in columns["env_tool_calls"]]
    return [
        float(sum(c > 0 for c in calls)),
        float(sum(calls)),
        float(sum(int(e[0]) for e in columns["env_error"])),
        float(sum(float(r[0]) for r in columns["env_reward"])),
        float(sum(int(np.asarray(m).sum()) for m in columns["loss_mask"])),
    ]
