"""The tiny verifiable tasks used by tests and examples, for the character-level
tiny model (``asyncflow.toy.tiny``); a response is a few digits then ``</s>``.

- ``add`` (the default; what the end-to-end example learns): the prompt is ``"3+4="``
  (operands 0..9), the answer ``"7"``. Reward (``reward``, loadable as
  ``asyncflow.toy.tasks:reward``): 0.1 for the format (1-2 digits ended by
  the stop token) + 0.9 for the exact answer.
- ``reverse``: ``"rev:372"`` -> ``"273"``, reward 0.1 format + 0.9 x digits in place
  (``reverse_reward``).
- ``add2`` (for a real model, ``examples/smollm2.toml``): ``"What is 27 + 82? Answer with
  the number only."`` -> ``"109"`` (operands 10..99, 8,100 distinct prompts); scored by
  the built-in ``math_answer`` (the response's last number). SmolLM2-135M-Instruct's
  greedy accuracy on it, before and after GRPO: docs/real-model.md.
- ``add1`` (for a base model, ``examples/gemma3.toml``): ``"Question: What is seven plus
  nine?\nAnswer:"`` -> ``"16"`` (operands 0..9: 100 distinct prompts, so hold out about a
  third: ``eval.num_prompts = 30``); scored by ``math_answer``, a response ending at the
  first newline (the example's ``stop_token_ids``). Gemma 3 270M (base) mostly writes the
  question in digits and stops there ("7+9"): greedy accuracy 0.03 on the example's 30
  held-out prompts (``scripts/start_accuracy.py``; 0.12 on 64 random ones), sampled at
  temperature 1 0.06, though it knows most one-digit sums ("3 + 7 = 10" for 0.74 of "What is
  3 + 7?"). Two-digit addition is beyond it (``add2``: 0.00 on 30 held-out prompts as a run
  scores it, 0.06 asked as a question and answer).
- ``calc``: ``"37*48="`` -> ``"1776"``, solvable only with the ``calc`` tool of
  ``asyncflow.envs.calc:CalcEnv`` (multi-turn, docs/environments.md); its warm start
  is on whole tool trajectories (``envs/calc.warm_start``).

Warm start (``make_task_model``), measured on this 2-core machine:
- ``warm_start="task"`` (default): 100 steps (about 3 s) of supervised training on
  correct answers, stopped early: greedy accuracy about 0.1, sampled exact about
  0.1. GRPO then lifts the sampled exact rate to about 0.4-0.5 within 300 steps of
  16 prompts x 8 samples (about 0.1-0.2 s each) -- the SFT-then-RL regime of real
  post-training, where the policy already conditions on the prompt.
- ``warm_start="format"``: random well-formed answers, independent of the prompt.
  The model then ignores the prompt, and GRPO collapses onto the most frequent sum
  (entropy falls, greedy accuracy stays at chance): kept as a counter-example, not
  for demos.

Datasets are JSONL with ``prompt`` and ``answer`` fields (``write_jsonl``).
Invariant: the same seed gives the same data and the same model.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Literal

from asyncflow.algorithms.rewards import RewardFn, exact_match, format_reward, weighted_sum

REVERSE_DIGITS = 3


def digit_accuracy(prompts: list[str], responses: list[str], answers: list[str], finish_reasons: list[str]) -> list[float]:
    """Fraction of the answer's characters the response has at the same place."""
    out = []
    for r, a in zip(responses, answers):
        r = r.strip()
        out.append(sum(x == y for x, y in zip(r, a)) / len(a) if a else float(r == a))
    return out


reward: RewardFn = weighted_sum((0.1, format_reward(r"\d{1,2}")), (0.9, exact_match))
"""Reward of the ``add`` task: fn(prompts, responses, answers, finish_reasons)."""

reverse_reward: RewardFn = weighted_sum((0.1, format_reward(rf"\d{{{REVERSE_DIGITS}}}")), (0.9, digit_accuracy))
"""Reward of the ``reverse`` task."""


def reverse_example(rng: random.Random) -> dict[str, str]:
    digits = "".join(str(rng.randint(0, 9)) for _ in range(REVERSE_DIGITS))
    return {"prompt": f"rev:{digits}", "answer": digits[::-1]}


ADD_MAX_OPERAND = 9


def add_example(rng: random.Random) -> dict[str, str]:
    a, b = rng.randint(0, ADD_MAX_OPERAND), rng.randint(0, ADD_MAX_OPERAND)
    return {"prompt": f"{a}+{b}=", "answer": str(a + b)}


def calc_example(rng: random.Random) -> dict[str, str]:
    from asyncflow.envs.calc import calc_example as example

    return example(rng)


def add2_example(rng: random.Random) -> dict[str, str]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return {"prompt": f"What is {a} + {b}? Answer with the number only.", "answer": str(a + b)}


ONE_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def add1_example(rng: random.Random) -> dict[str, str]:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    words = ONE_DIGIT_WORDS
    return {"prompt": f"Question: What is {words[a]} plus {words[b]}?\nAnswer:", "answer": str(a + b)}


EXAMPLES = {
    "reverse": reverse_example,
    "add": add_example,
    "calc": calc_example,
    "add2": add2_example,
    "add1": add1_example,
}
REAL_MODEL_TASKS = ("add2", "add1")
"""Tasks in words, for a real model's tokenizer (the tiny character model cannot learn them)."""
REWARDS = {"add": reward, "reverse": reverse_reward}


def make_examples(num_examples: int, seed: int = 0, task: str = "add") -> list[dict[str, str]]:
    if task not in EXAMPLES:
        raise ValueError(f"unknown task {task!r}; use one of {sorted(EXAMPLES)}")
    rng = random.Random(seed)
    return [EXAMPLES[task](rng) for _ in range(num_examples)]


def write_jsonl(path: str | Path, num_examples: int, seed: int = 0, task: str = "add") -> Path:
    """A dataset file: one JSON object per line with ``prompt`` and ``answer``."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for ex in make_examples(num_examples, seed, task):
            f.write(json.dumps(ex) + "\n")
    return out


def format_warmup_pairs(num_pairs: int = 2000, seed: int = 0, task: str = "add") -> list[tuple[str, str]]:
    """(prompt, random well-formed answer) pairs: the format, not the task. Random
    answers are drawn from the task's own answers, shuffled away from their prompts."""
    examples = make_examples(2 * num_pairs, seed, task)
    prompts, answers = [e["prompt"] for e in examples[:num_pairs]], [e["answer"] for e in examples[num_pairs:]]
    return list(zip(prompts, answers))


def task_warmup_pairs(num_pairs: int = 2000, seed: int = 0, task: str = "add") -> list[tuple[str, str]]:
    """(prompt, correct answer) pairs: a short supervised pass on these leaves a
    partly trained model (the 'SFT before RL' of real post-training)."""
    return [(e["prompt"], e["answer"]) for e in make_examples(num_pairs, seed, task)]


def make_task_model(
    out_dir: str | Path,
    seed: int = 0,
    task: str = "add",
    warm_start: str = "task",
    warm_start_steps: int = 100,
    arch: Literal["qwen2", "llama"] = "qwen2",
    progress=None,
    **config_kwargs,
) -> Path:
    """The tiny model for ``task``, warm-started and saved to ``out_dir``.

    ``warm_start``: 'task' (supervised on correct answers for ``warm_start_steps``
    steps, stopped early) or 'format' (random well-formed answers); ``progress(done,
    total, loss)``: called as the warm start goes (``toy.tiny.masked_warm_start``)."""
    from asyncflow.toy.tiny import make_tiny_model

    if task == "calc":  # a multi-turn tool task: warm-started on whole trajectories, loss on model turns
        from asyncflow.envs.calc import warm_start as calc_warm_start

        def warm(model, tokenizer) -> None:
            if warm_start_steps:
                calc_warm_start(model, tokenizer, warm_start_steps, seed=seed, progress=progress)

        return make_tiny_model(out_dir, arch=arch, seed=seed, warm_start_fn=warm, **config_kwargs)
    if warm_start not in ("task", "format"):
        raise ValueError(f"warm_start={warm_start!r}; use 'task' or 'format'")
    pairs = task_warmup_pairs(seed=seed, task=task) if warm_start == "task" else format_warmup_pairs(seed=seed, task=task)
    return make_tiny_model(
        out_dir,
        arch=arch,
        seed=seed,
        warm_start_pairs=pairs,
        warm_start_steps=warm_start_steps,
        warm_start_progress=progress,
        **config_kwargs,
    )


def reward_model_examples(num_examples: int = 4000, seed: int = 0, task: str = "add") -> list[tuple[str, str, float]]:
    """(prompt, response, target) texts to train a tiny reward model on: the task's
    reward of a response (``REWARDS[task]``), over correct answers, wrong answers of the
    right format and malformed ones, in equal parts. A wrong answer is the answer of
    another of the task's prompts, so every answer the task has is seen as wrong too
    (a policy that says one answer to every prompt finds no blind spot there)."""
    rng = random.Random(seed)
    fn = REWARDS[task]
    examples = make_examples(num_examples, seed, task)
    others = [e["answer"] for e in make_examples(num_examples, seed + 1, task)]
    out = []
    for i, e in enumerate(examples):
        kind = i % 3
        response = e["answer"]
        if kind == 1:  # the format, a wrong value
            while response == e["answer"]:
                response = others[rng.randrange(len(others))]
        elif kind == 2:  # malformed: a letter, a sign, or too many digits
            response = rng.choice(["x", e["answer"] + "+", "".join(str(rng.randint(0, 9)) for _ in range(4))])
        out.append((e["prompt"], response, float(fn([e["prompt"]], [response], [e["answer"]], ["stop"])[0])))
    return out


def make_task_reward_model(
    out_dir: str | Path,
    seed: int = 0,
    task: str = "add",
    steps: int = 300,
    arch: Literal["qwen2", "llama"] = "qwen2",
) -> Path:
    """The tiny reward model of ``task``: a sequence classifier trained for ``steps``
    steps to predict the task's reward (``reward_model_examples``), saved to ``out_dir``."""
    from asyncflow.toy.tiny import make_tiny_reward_model

    path, _ = make_tiny_reward_model(out_dir, reward_model_examples(seed=seed, task=task), arch=arch, seed=seed, steps=steps)
    return path
