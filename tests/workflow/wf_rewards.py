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
