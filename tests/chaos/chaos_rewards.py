"""A reward function that goes bad while a flag file says so (the chaos suite's hostile rewards).

``AF_CHAOS_BAD_REWARD`` names the file. While it exists, its text says how the
function misbehaves: ``nan`` (the last value is NaN), ``short`` (one value too few),
``raise`` (raises ValueError) or ``hang`` (blocks until the file is removed).
Without the file it scores like ``wf_rewards.length``: varied values, so every step
has a real gradient and the weights change.
"""

import os
import time
from pathlib import Path

_flag = os.environ.get("AF_CHAOS_BAD_REWARD", "")


def switchable(prompts: list[str], responses: list[str], answers: list[str], finish_reasons: list[str]) -> list[float]:
    out = [len(r) / 10.0 for r in responses]
    mode = Path(_flag).read_text().strip() if _flag and Path(_flag).exists() else ""
    if mode == "nan":
        out[-1] = float("nan")
    elif mode == "short":
        out = out[:-1]
    elif mode == "raise":
        raise ValueError("chaos: this reward function raised on purpose")
    elif mode == "hang":
        while Path(_flag).exists():
            time.sleep(0.05)
    return out
