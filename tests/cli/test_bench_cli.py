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
