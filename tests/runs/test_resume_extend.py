"""Extending a finished run: ``afctl up --resume RUN --set train.num_steps=N``."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from wf_helpers import afctl, read_jsonl, write_config

from asyncflow.actors.driver.prepare import write_run_config
from asyncflow.cli.up import up
from asyncflow.config.load import ConfigError
from asyncflow.config.resumable import apply_resume_overrides
from asyncflow.config.run import RunConfig


@pytest.mark.timeout(10)
def test_keys_that_can_change_on_resume_are_applied():
    cfg = apply_resume_overrides(RunConfig(), ["train.num_steps=90", "logging.progress=false", "train.checkpoint_every=5"])
    assert (cfg.train.num_steps, cfg.logging.progress, cfg.train.checkpoint_every) == (90, False, 5)


@pytest.mark.timeout(10)
def test_a_key_that_cannot_change_on_resume_is_refused_by_name_with_the_reason():
    with pytest.raises(ConfigError, match=r"--set model.path: cannot change when resuming \(the checkpoint holds"):
        apply_resume_overrides(RunConfig(), ["model.path=/elsewhere"])
    with pytest.raises(ConfigError, match=r"--set algorithm.group_size: cannot change .*train.num_steps"):
        apply_resume_overrides(RunConfig(), ["algorithm.group_size=4"])


@pytest.mark.timeout(10)
def test_turning_evaluation_on_at_resume_is_refused():
    with pytest.raises(ConfigError, match="cannot turn evaluation on when resuming"):
        apply_resume_overrides(RunConfig(), ["eval.every_steps=2"])


@pytest.mark.timeout(10)
def test_afctl_up_resume_refuses_a_key_by_name_before_starting_anything(tmp_path):
    write_run_config(RunConfig(), tmp_path)
    result = CliRunner().invoke(up, ["--resume", str(tmp_path), "--set", "rollout.num_replicas=3"])
    assert result.exit_code != 0
    assert "--set rollout.num_replicas: cannot change when resuming" in result.output


@pytest.mark.slow  # 35 s: test_e2e's resume test covers resuming in the default suite
@pytest.mark.timeout(300)
def test_a_finished_run_resumed_with_more_steps_trains_only_the_new_steps(tmp_path):
    run_dir = tmp_path / "run"
    first = afctl("up", str(write_config(tmp_path, num_steps=3)), "--run-dir", str(run_dir))
    out, _ = first.communicate(timeout=140)
    assert first.returncode == 0, out
    again = afctl("up", "--resume", str(run_dir))
    out, _ = again.communicate(timeout=60)
    assert again.returncode != 0 and "--set train.num_steps=" in out, out  # the error says how to go on
    second = afctl("up", "--resume", str(run_dir), "--set", "train.num_steps=5")
    out, _ = second.communicate(timeout=140)
    assert second.returncode == 0, out
    assert [int(m["step"]) for m in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    assert [t["step"] for t in read_jsonl(run_dir / "trained.jsonl")] == [0, 1, 2, 3, 4]
    assert json.loads((run_dir / "config.json").read_text())["train"]["num_steps"] == 5
