"""examples/hub learns: the calculator task written as an OpenEnv environment, played
through asyncflow's OpenEnv adapter, trains the tiny model (its tool-call rate and its
reward rise, as examples/tools.toml's do). Marked slow (a few minutes on 2 cores), and
skipped without openenv-core:

    python -m pytest -m slow tests/runs/test_hub_learning.py

Runs ``examples/hub/measure.py``, the command whose JSON line docs/environments.md
quotes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_hub_example_raises_its_tool_call_rate_and_doubles_its_reward(tmp_path):
    pytest.importorskip(
        "openenv.core", reason="openenv-core is not installed (pip install -e '.[openenv]' in the asyncflow checkout)"
    )
    done = subprocess.run(
        [sys.executable, "examples/hub/measure.py", "--out", str(tmp_path / "hub")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1150,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["tool_call_rate_last_10pct"] > result["tool_call_rate_first_10pct"] + 0.2, result
    assert result["reward_last_10pct"] >= 2 * result["reward_first_10pct"], result
    assert result["env_error_rate_max"] == 0, result
