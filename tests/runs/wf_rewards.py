"""Reward functions for the tiny end-to-end runs (loaded by dotted path from a config)."""


def length(prompts: list[str], responses: list[str], answers: list[str], finish_reasons: list[str]) -> list[float]:
    """Longer is better: an untrained tiny model gets varied, non-zero rewards, so
    every step has non-zero advantages and a real gradient."""
    return [len(r) / 10.0 for r in responses]


_num_calls = 0


def nan_from_the_third_call(
    prompts: list[str], responses: list[str], answers: list[str], finish_reasons: list[str]
) -> list[float]:
    """``length`` for two calls, then NaN for the last sample: a reward host that goes bad mid-run."""
    global _num_calls
    _num_calls += 1
    out = length(prompts, responses, answers, finish_reasons)
    if _num_calls >= 3:
        out[-1] = float("nan")
    return out


def constant_for_even_answers(
    prompts: list[str], responses: list[str], answers: list[str], finish_reasons: list[str]
) -> list[float]:
    """0.5 for every response of a prompt whose answer is even (a group of equal rewards,
    whatever the responses), a random reward otherwise (never equal within a group):
    which groups carry a gradient is known from the prompt alone."""
    import random

    return [0.5 if int(a) % 2 == 0 else random.random() for a in answers]


def stop_and_aligned(prompts: list[str], responses: list[str], answers: list[str], finish_reasons: list[str]) -> list[float]:
    """1 for a response that stopped, plus 1 if the row's answer is its own prompt's
    sum (the ``add`` task, "a+b="): a step's ``reward_mean`` is exactly
    2 - ``truncated_frac`` when every row is scored with its own prompt, answer and
    finish reason."""
    out = []
    for prompt, answer, finish in zip(prompts, answers, finish_reasons):
        a, b = prompt.removesuffix("=").split("+")
        out.append(float(finish == "stop") + float(str(int(a) + int(b)) == answer))
    return out


def scattered(prompts: list[str], responses: list[str], answers: list[str], finish_reasons: list[str]) -> list[float]:
    """A deterministic reward spread over [0, 1) by the response text's CRC-32: two
    different samples of an untrained model almost never tie, whatever their length or
    characters (``length`` is constant when every response has the same length)."""
    import zlib

    return [zlib.crc32(r.encode()) % 1000 / 1000 for r in responses]
