"""``afctl bench e2e --partial-rollout``'s report: samples/s ratio and the rollout's idle
fraction from busy time and decode-row occupancy (bench/e2e.py, partial_report)."""

import json
from pathlib import Path

from asyncflow.bench.e2e import partial_report


def _result(samples_per_s: float, busy: float, steps: float, rows: float) -> dict:
    return {
        "samples_per_s": samples_per_s,
        "tokens_per_s": 10 * samples_per_s,
        "pipeline_efficiency": 1.0,
        "staleness_max": 1,
        "train_span_s": 5.0,
        "busy_fraction": {"rollout.0": busy, "trainer": 0.5},
        "counters": {"rollout.0": {"decode_steps": steps, "decode_rows": rows}},
    }


def test_the_report_gives_the_ratio_and_the_rollouts_idle_from_busy_time_and_empty_rows(capsys):
    # 8 rows: off decodes 2 per step (busy all the time), on 6 per step busy 90% of the time
    partial_report(_result(10.0, 1.0, 100, 200), _result(25.0, 0.9, 100, 600), capacity=8, root=Path("/x"), as_json=True)
    out = capsys.readouterr().out
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["ratio"] == 2.5
    assert abs(figures["async_rollout_idle"] - 0.75) < 1e-9  # 1 - 1.0 x 2/8
    assert abs(figures["partial_rollout_idle"] - (1 - 0.9 * 0.75)) < 1e-9
    assert abs(figures["partial_rollout_empty_rows"] - 0.25) < 1e-9
    assert "partial / async samples/s: 2.50x, rollout idle 0.750 -> 0.325" in out
