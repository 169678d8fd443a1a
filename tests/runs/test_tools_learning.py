"""examples/tools.toml learns: the tiny model, warm-started to know the calc tool but
to call it on only about a fifth of the prompts, learns by RL to call it. Marked
slow (a few minutes on 2 cores):

    python -m pytest -m slow tests/runs/test_tools_learning.py

Fails with the environment off (``--set env.path=`` leaves single-turn rollouts
scored by no function: no tool-call rate, reward 0) and when the multi-turn rollout
or the environment reward does not reach the trainer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_tools_example_raises_its_tool_call_rate_and_doubles_its_reward(tmp_path):
    run_dir = tmp_path / "tools"
    done = subprocess.run(
        [sys.executable, "-m", "asyncflow.cli.main", "up", "examples/tools.toml", "--run-dir", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1150,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    n = max(1, len(rows) // 10)
    mean = lambda key, part: sum(r[key] for r in part) / len(part)  # noqa: E731
    first, last = rows[:n], rows[-n:]
    assert mean("env/tool_call_rate", last) > mean("env/tool_call_rate", first) + 0.2, [r["env/tool_call_rate"] for r in rows]
    assert mean("reward_mean", last) >= 2 * mean("reward_mean", first), [r["reward_mean"] for r in rows]
    assert all(r["env/error_rate"] == 0 for r in rows)
    assert 0 < mean("env/model_token_frac", rows) < 1  # observations are in the responses, out of the loss
