"""With the built-in tiny model (no ``model.path``), a prompt longer than the model's positions
is refused by its file and line, with the limit and the fix, before anything is built or
estimated (it used to reach the memory estimate, which refused the run for host memory)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from asyncflow.config.load import load_config_text
from asyncflow.core.schema import ConfigError

GOOD = '{"prompt": "What is 1 + 1?", "answer": "2"}\n'
HUGE = 5 << 20  # characters: a 5 MB prompt


def _plant(tmp_path) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text(GOOD * 2 + '{"prompt": "' + "1 + " * (HUGE // 4) + '1?", "answer": "2"}\n' + GOOD * 5)
    return str(path)


@pytest.mark.timeout(120)  # encoding 5 MB takes ~12 s on a busy 2-core machine
def test_the_preflight_refuses_a_5mb_prompt_of_the_tiny_model_by_its_line_with_the_limit_and_the_fix(tmp_path):
    from asyncflow.actors.driver.preflight import check_inputs

    data = _plant(tmp_path)
    cfg = load_config_text(f"[data]\npath = {data!r}")
    with pytest.raises(ConfigError) as refused:
        check_inputs(cfg)
    text = str(refused.value)
    assert f"data.path = {data!r}" in text and "line 3 (" in text, text
    assert "max_position_embeddings 512 less rollout.sampling.max_new_tokens" in text, text  # the limit
    assert "shorten or drop them" in text, text  # the fix


@pytest.mark.timeout(240)
def test_afctl_up_refuses_it_before_building_the_model_or_estimating_memory(tmp_path):
    data = _plant(tmp_path)
    config = tmp_path / "run.toml"
    config.write_text(f"[data]\npath = {data!r}\n[train]\nnum_steps = 1\n")
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "asyncflow.cli.main", "up", str(config), "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=200,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "line 3 (" in out and "max_position_embeddings" in out, out
    assert "memory" not in out.replace("max_position_embeddings", ""), out  # no estimate ran, nor refused
    assert not (run_dir / "model").exists(), out  # refused before the tiny model was built
