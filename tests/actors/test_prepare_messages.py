"""What ``afctl up`` says while it prepares a run, before any process starts."""

from __future__ import annotations

import pytest
from tiny_config import tiny_config_text

from asyncflow.actors.driver.prepare import prepare_new
from asyncflow.config.load import load_config_text

pytestmark = pytest.mark.timeout(120)


def test_data_of_your_own_with_the_tiny_model_says_what_it_is_warm_started_on(tmp_path, capsys):
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(f'{{"prompt": "sort {i}{i + 1}", "answer": "{i}{i + 1}"}}\n' for i in range(40)))
    text = tiny_config_text(
        {"data": {"path": str(data)}, "model": {"tiny_warm_start": True, "tiny_warm_start_steps": 10}, "eval": {"every_steps": 0}}
    )
    prepare_new(load_config_text(text), tmp_path / "run")
    out = capsys.readouterr()
    assert "warm-started on the built-in task 'add'" in out.err and "examples/smollm2.toml" in out.err
    assert "warm start 10/10 steps" in out.out  # the warm start is no longer a silent minute

    prepare_new(load_config_text(text.replace("tiny_warm_start = true", "tiny_warm_start = false")), tmp_path / "r2")
    assert "warm-started" not in capsys.readouterr().err  # from random weights: nothing to warn about
