"""``afctl samples RUN_DIR``: what the model wrote, as a table (cli/samples.py), on
planted samples.jsonl and eval_samples.jsonl files."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from asyncflow.cli.main import main

pytestmark = pytest.mark.timeout(30)

TRAIN = [
    {"step": 0, "prompt": "What is 1 + 1?", "response": "3", "reward": 0.0, "finish": "stop", "version": 0},
    {"step": 0, "prompt": "What is 1 + 1?", "response": "2", "reward": 1.0, "finish": "stop", "version": 0},
    {"step": 1, "prompt": "What is 2 + 5?", "response": "7\nbecause", "reward": 0.5, "finish": "length", "version": 0},
    {"step": 1, "prompt": "What is 2 + 5?", "response": "8", "reward": 0.25, "finish": "stop", "version": 1},
]
EVAL = [
    {"step": 0, "version": 0, "prompt": "What is 3 + 3?", "response": "9", "reward": 0.0, "answer": "6", "finish": "stop"},
    {"step": 1, "version": 2, "prompt": "What is 3 + 3?", "response": "6", "reward": 1.0, "answer": "6", "finish": "stop"},
]


@pytest.fixture
def run_dir(tmp_path):
    for name, rows in (("samples.jsonl", TRAIN), ("eval_samples.jsonl", EVAL)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def table(*args: str, width: int = 100) -> list[str]:
    result = CliRunner().invoke(main, ["samples", *args], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def cells(lines: list[str]) -> list[list[str]]:
    """The body's rows, split into their columns (the header and its rule left out)."""
    return [[c.strip() for c in line.split(" | ")] for line in lines[2:]]


def test_the_table_lists_step_version_reward_prompt_and_completion_in_file_order(run_dir):
    lines = table(str(run_dir))
    assert [c.strip() for c in lines[0].split(" | ")] == ["step", "version", "reward", "prompt", "completion"]
    assert set(lines[1]) <= {"-", "+"}
    assert cells(lines) == [  # steps numbered as the progress lines number them: the file's index + 1
        ["1", "0", "0.000", "What is 1 + 1?", "3"],
        ["1", "0", "1.000", "What is 1 + 1?", "2"],
        ["2", "0", "0.500", "What is 2 + 5?", "7⏎because"],  # one line per row: a newline is shown, not printed
        ["2", "1", "0.250", "What is 2 + 5?", "8"],
    ]


def test_worst_and_best_order_by_reward_and_step_keeps_one_step(run_dir):
    assert [row[2] for row in cells(table(str(run_dir), "--worst"))] == ["0.000", "0.250", "0.500", "1.000"]
    assert [row[2] for row in cells(table(str(run_dir), "--best"))] == ["1.000", "0.500", "0.250", "0.000"]
    assert [(row[0], row[4]) for row in cells(table(str(run_dir), "--step", "2", "--worst"))] == [("2", "8"), ("2", "7⏎because")]
    assert [row[4] for row in cells(table(str(run_dir), "--best", "--limit", "1"))] == ["2"]


def test_eval_shows_the_evaluations_completions_with_their_answers_after_the_steps_trained_before_them(run_dir):
    lines = table(str(run_dir), "--eval", "--worst")
    assert [c.strip() for c in lines[0].split(" | ")] == ["after step", "version", "reward", "prompt", "completion", "answer"]
    # the start evaluation (after step 0), then the one after the file's step index 1, the progress line's step 2
    assert cells(lines) == [["0", "0", "0.000", "What is 3 + 3?", "9", "6"], ["2", "2", "1.000", "What is 3 + 3?", "6", "6"]]
    assert [row[4] for row in cells(table(str(run_dir), "--eval", "--step", "0"))] == ["9"]


def test_every_line_fits_the_terminal_and_a_long_text_is_shortened_with_an_ellipsis(run_dir):
    long = {**TRAIN[0], "prompt": "Count: " + "one two three " * 40, "response": "x" * 500}
    (run_dir / "samples.jsonl").write_text(json.dumps(long) + "\n")
    lines = table(str(run_dir), width=60)
    assert all(len(line) <= 60 for line in lines), [len(line) for line in lines]
    prompt, completion = cells(lines)[0][3:]
    assert prompt.startswith("Count: one") and prompt.endswith("…") and completion.endswith("…")


def test_worst_and_best_together_are_refused_and_a_missing_file_names_the_key_that_writes_it(tmp_path, run_dir):
    result = CliRunner().invoke(main, ["samples", str(run_dir), "--worst", "--best"])
    assert result.exit_code != 0 and "--worst or --best, not both" in result.output
    result = CliRunner().invoke(main, ["samples", str(tmp_path / "none")])
    assert result.exit_code != 0
    (run_dir / "eval_samples.jsonl").unlink()
    result = CliRunner().invoke(main, ["samples", str(run_dir), "--eval"])
    assert result.exit_code != 0 and "eval.every_steps" in result.output, result.output
    (run_dir / "samples.jsonl").unlink()
    result = CliRunner().invoke(main, ["samples", str(run_dir)])
    assert result.exit_code != 0 and "logging.samples_every" in result.output, result.output
