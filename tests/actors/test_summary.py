"""summary.json after a resume and after Ctrl-C."""

from __future__ import annotations

import json

import pytest

from asyncflow.actors.driver.summary import launches, reward_trend, run_clock, summarize, train_span_s
from asyncflow.config.run import RunConfig


def _launch(num_steps: int, first_step: int, startup_s: float, step_s: float, samples: int = 4) -> list[dict]:
    """Rows of one launch: its trainer's clock starts at 0, its totals at 0."""
    return [
        {
            "step": first_step + k,
            "samples": samples,
            "tokens": 10 * samples,
            "total_samples": samples * (k + 1),
            "time_s": startup_s + step_s * (k + 1),
            "step_time_s": step_s,
            "reward_mean": float(first_step + k),
            "staleness_max": 1,
        }
        for k in range(num_steps)
    ]


def _write(tmp_path, rows):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.timeout(10)
def test_rows_of_a_resumed_run_split_into_launches_by_the_trainers_counters():
    rows = _launch(10, 0, 30.0, 1.0) + _launch(20, 10, 5.0, 1.0)
    assert [len(part) for part in launches(rows)] == [10, 20]
    assert train_span_s(rows) == pytest.approx(30.0)
    clock = run_clock(rows)
    assert clock[9] == pytest.approx(10.0) and clock[10] == pytest.approx(11.0) and clock[-1] == pytest.approx(30.0)


@pytest.mark.timeout(10)
def test_summary_of_a_resumed_run_counts_every_sample_over_every_launchs_training_time(tmp_path):
    # 10 steps of 1 s, then a resume that trains 20 more steps of 1 s after a 5 s start-up
    _write(tmp_path, _launch(10, 0, 30.0, 1.0) + _launch(20, 10, 5.0, 1.0))
    summary = summarize(tmp_path, RunConfig(), {}, 40.0, [], None)
    assert summary["steps"] == 30 and summary["launches"] == 2
    assert summary["samples"] == 120 and summary["train_span_s"] == pytest.approx(30.0)
    assert summary["samples_per_s"] == pytest.approx(4.0)
    assert (summary["launch_steps"], summary["launch_samples"]) == (20, 80)
    assert summary["launch_samples_per_s"] == pytest.approx(4.0)
    assert summary["interrupted"] is False


@pytest.mark.timeout(10)
def test_summary_of_a_run_interrupted_before_its_first_step_is_still_written(tmp_path):
    summary = summarize(tmp_path, RunConfig(), {}, 3.0, [], None, interrupted=True)
    assert summary["interrupted"] is True and summary["steps"] == 0 and summary["samples_per_s"] == 0.0


@pytest.mark.timeout(10)
def test_reward_trend_is_the_mean_of_the_first_and_last_tenth():
    rows = [{"reward_mean": float(k)} for k in range(20)]
    assert reward_trend(rows) == (0.5, 18.5)


@pytest.mark.timeout(10)
def test_with_dynamic_sampling_the_reward_trend_is_that_of_every_sampled_response():
    rows = [{"reward_mean": 0.5, "sampled_reward_mean": float(k)} for k in range(20)]
    assert reward_trend(rows) == (0.5, 18.5)


@pytest.mark.timeout(10)
def test_a_custom_roles_score_column_gets_a_per_step_mean_metric():
    import numpy as np

    from asyncflow.actors.trainer.step_end import score_means

    columns = {"judge_score": [np.array([-0.1]), np.array([0.0]), np.array([-0.2])]}
    assert score_means(columns, [("judge_score", 2.0)]) == {"score/judge_score": pytest.approx(-0.1)}
    assert score_means(columns, []) == {}
