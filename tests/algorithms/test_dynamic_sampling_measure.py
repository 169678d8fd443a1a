"""The arithmetic behind the dynamic-sampling figure (scripts/dynamic_sampling_check.py):
the trailing mean, the first step a curve reaches a target, and the seeds' mean curve."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "dynamic_sampling_check.py"


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("dynamic_sampling_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(30)
def test_the_trailing_mean_averages_the_last_window_steps(check):
    assert check.smoothed([1.0, 2.0, 3.0, 4.0], window=2) == [1.0, 1.5, 2.5, 3.5]
    assert check.smoothed([4.0, 0.0, 2.0], window=5) == [4.0, 2.0, 2.0]  # fewer steps than the window so far


@pytest.mark.timeout(30)
def test_steps_to_counts_only_full_windows_and_the_whole_run_when_never_reached(check):
    curve = [0.9, 0.1, 0.2, 0.5, 0.6]
    assert check.steps_to(curve, 0.5, window=2) == 4  # step 1's 0.9 is not a full window
    assert check.steps_to(curve, 0.95, window=2) == 5  # never: the run's length
    assert check.steps_to(curve, 0.5, window=1) == 1


@pytest.mark.timeout(30)
def test_the_mean_curve_averages_the_seeds_step_by_step_and_refuses_unequal_runs(check):
    assert check.mean_curve([[0.0, 1.0], [1.0, 3.0]]) == [0.5, 2.0]
    with pytest.raises(ValueError):
        check.mean_curve([[0.0, 1.0], [1.0]])


@pytest.mark.timeout(30)
def test_a_dynamic_run_is_read_by_the_reward_of_every_response_it_sampled(check, tmp_path):
    """Dropped groups count: with dynamic sampling the curve is sampled_reward_mean, not the
    mean over the trained (informative) groups, which leaves out the all-right ones."""
    lines = [
        {"step": 1, "reward_mean": 0.5, "sampled_reward_mean": 0.7, "staleness_mean": 1.0},
        {"step": 0, "reward_mean": 0.4, "sampled_reward_mean": 0.6, "staleness_mean": 0.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    assert check.rewards(tmp_path) == [0.6, 0.7]  # in step order
    assert check.mean_staleness(tmp_path) == 0.5
