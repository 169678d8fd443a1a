"""One step numbering wherever a user reads a step: the console's, 1-based ("step 5/10"
is the fifth step). metrics.jsonl keeps ``step`` as the 0-based index of the step
(docs/metrics.md); summary.json, ``afctl up``'s last lines, ``afctl status`` and
``afctl plot`` say the number the progress line printed for that step."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from asyncflow.actors.driver.collector import progress_line

NUM_STEPS = 10
BEST_INDEX = 4  # metrics.jsonl's step of the best evaluation: the console's step 5


def row(index: int, **extra: float) -> dict:
    launch_samples = 4 * (index + 1)
    return {
        "step": index,
        "version": index + 1,
        "reward_mean": 0.1 * index,
        "response_len_mean": 10.0,
        "samples": 4,
        "tokens": 40,
        "total_samples": launch_samples,
        "total_tokens": 10 * launch_samples,
        "time_s": 1.0 + index,
        "step_time_s": 1.0,
        "staleness_max": 0,
        **extra,
    }


def plant_run(rd: Path, num_rows: int = 6) -> list[dict]:
    """A run directory whose metrics.jsonl evaluated at indices 2, 4 and 5, the best at 4."""
    accuracy = {2: 0.25, BEST_INDEX: 0.75, 5: 0.5}
    rows = [row(k, **({"val/accuracy": accuracy[k]} if k in accuracy else {})) for k in range(num_rows)]
    rd.mkdir(parents=True, exist_ok=True)
    (rd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def console_step(values: dict) -> int:
    """The step number the progress line prints for this metrics object."""
    match = re.match(r"step +(\d+)/", progress_line(values, NUM_STEPS, {}))
    assert match is not None
    return int(match.group(1))


@pytest.mark.timeout(60)
def test_summary_json_and_the_up_console_line_name_the_best_step_as_the_progress_line_did(tmp_path, monkeypatch):
    from asyncflow.actors.driver import launcher
    from asyncflow.actors.driver.summary import val_summary
    from asyncflow.cli.up import up

    rows = plant_run(tmp_path / "run")
    best = val_summary(tmp_path / "run", rows)
    printed = console_step(rows[BEST_INDEX])
    assert printed == 5
    assert best["val_best_step"] == printed
    summary = {
        "steps": len(rows),
        "samples_per_s": 1.0,
        "tokens_per_s": 10.0,
        "reward_first_10pct": 0.0,
        "reward_last_10pct": 0.5,
        "staleness_max": 0,
        "checkpoint": "",
        **best,
    }
    monkeypatch.setattr(launcher, "run", lambda *args, **kwargs: summary)
    before = signal.getsignal(signal.SIGTERM)  # `afctl up` turns SIGTERM into Ctrl-C
    try:
        result = CliRunner().invoke(up, ["--resume", str(tmp_path / "run")])
    finally:
        signal.signal(signal.SIGTERM, before)
    assert result.exit_code == 0, result.output
    assert f"best 0.750 after step {printed}," in result.output


@pytest.mark.timeout(60)
def test_status_names_the_last_step_as_the_progress_line_did(tmp_path):
    from asyncflow.cli.status import _last_step, render

    rows = plant_run(tmp_path / "run")
    last = _last_step(str(tmp_path / "run"))
    assert last == console_step(rows[-1]) == 6
    snap = {
        "run_dir": str(tmp_path / "run"),
        "driver_pid": 1,
        "up_s": 1.0,
        "actors": [],
        "queue": None,
        "tasks": {},
        "weights": None,
        "last_step": last,
    }
    assert render(snap).splitlines()[0].endswith(", last trainer step 6")


@pytest.mark.timeout(120)
def test_plot_draws_and_prints_steps_as_the_progress_line_did(tmp_path):
    from asyncflow.actors.driver.summary import val_summary
    from asyncflow.cli.plot import plot, step_axis

    rows = plant_run(tmp_path / "run")
    assert step_axis(rows) == [console_step(r) for r in rows] == [1, 2, 3, 4, 5, 6]
    result = CliRunner().invoke(plot, [str(tmp_path / "run"), "--png", str(tmp_path / "plot.png")])
    assert result.exit_code == 0, result.output
    best = val_summary(tmp_path / "run", rows)["val_best_step"]
    assert f"best 0.750 after step {best}," in result.output
