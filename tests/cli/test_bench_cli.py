"""``afctl bench``: every subcommand listed, and ``bench planner`` from any directory."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from asyncflow.cli.bench import BENCHES, bench
from asyncflow.cli.main import COMMANDS, main


@pytest.mark.timeout(30)
def test_afctl_help_and_bench_help_name_every_benchmark():
    top = CliRunner().invoke(main, ["--help"]).output
    listed = CliRunner().invoke(bench, ["--help"]).output
    for name in BENCHES:
        assert name in COMMANDS["bench"][1], name
        assert f"  {name} " in listed, listed
    assert "weights, planner" in " ".join(top.split())


@pytest.mark.timeout(30)
def test_bench_planner_finds_its_default_config_from_another_directory(tmp_path, monkeypatch):
    import asyncflow.config.load as config

    seen = []

    def load_config(path, overrides=()):
        seen.append(path)
        raise click.ClickException("stop here")  # the run itself is not this test's business

    monkeypatch.setattr(config, "load_config", load_config)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["bench", "planner"])
    assert "stop here" in result.output, result.output
    assert seen and seen[0].endswith("examples/unbalanced.toml") and Path(seen[0]).is_file()


@pytest.mark.timeout(30)
def test_bench_planner_rounds_alternate_which_mode_goes_first_and_report_each_rounds_ratio(tmp_path, monkeypatch):
    import json

    import asyncflow.bench.planner as bench_planner

    ran = []

    def one_run(base, mode, on, run_dir, window):  # the runs themselves: tests/planner and tests/runs
        ran.append((run_dir.parent.name, mode, on))
        rate = 12.0 if on else 10.0
        return {"samples_per_s": rate, "decisions": [], "measured": [], "reverted": []}

    monkeypatch.setattr(bench_planner, "_run", one_run)
    monkeypatch.setattr(bench_planner, "EXAMPLE", Path(__file__).resolve().parents[2] / "examples" / "unbalanced.toml")
    monkeypatch.setattr("asyncflow.actors.driver.prepare.prepare_new", lambda cfg, d: (cfg, d, _Launch()))
    result = CliRunner().invoke(main, ["bench", "planner", "--rounds", "3", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert ran == [
        ("round1", "online", True),
        ("round1", "static", False),
        ("round2", "static", False),
        ("round2", "online", True),
        ("round3", "online", True),
        ("round3", "static", False),
    ]
    last = json.loads(result.output.strip().splitlines()[-1])
    assert last["ratios"] == [1.2, 1.2, 1.2]
    assert "slowest 1.20x" in result.output


class _Launch:
    model_dir = "m"
    data_path = "d.jsonl"


@pytest.mark.timeout(30)
def test_bench_planner_set_changes_the_config_of_every_run(tmp_path, monkeypatch):
    import asyncflow.bench.planner as bench_planner

    costs = []

    def one_run(base, mode, on, run_dir, window):
        costs.append((mode, base.planner.move_cost_s, base.train.num_steps))
        return {"samples_per_s": 10.0, "decisions": [], "measured": [], "reverted": []}

    monkeypatch.setattr(bench_planner, "_run", one_run)
    monkeypatch.setattr(bench_planner, "EXAMPLE", Path(__file__).resolve().parents[2] / "examples" / "unbalanced.toml")
    monkeypatch.setattr("asyncflow.actors.driver.prepare.prepare_new", lambda cfg, d: (cfg, d, _Launch()))
    args = ["bench", "planner", "--rounds", "2", "--steps", "40", "--set", "planner.move_cost_s=3.5", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert costs == [("online", 3.5, 40), ("static", 3.5, 40), ("static", 3.5, 40), ("online", 3.5, 40)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bench_name", ["peer", "e2e", "planner"])
def test_a_wrong_set_ends_a_benchmark_with_the_key_and_the_fix_not_a_traceback(bench_name):
    config = Path(__file__).resolve().parents[2] / "examples" / "local.toml"
    args = ["bench", bench_name, "--config", str(config), "--set", "eval.every_steps=0"]
    done = CliRunner().invoke(main, [*args, "--set", "eval.at_start=true"])
    assert done.exit_code == 1, (done.output, done.exception)
    assert "Error: config: eval.at_start = True" in done.output and "set eval.every_steps too" in done.output
    assert "Traceback" not in done.output
