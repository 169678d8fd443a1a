"""``afctl bench train --config``: a run's trainer on a batch of its step's shape, against the
bfloat16 matmul peak, with the places the rest of a step goes and a baseline side by side."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from asyncflow.cli.main import main


@pytest.mark.timeout(180)
def test_bench_train_config_reports_the_fraction_of_the_peak_and_three_places(tmp_path):
    from asyncflow.toy.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "model", arch="llama", seed=0)
    config = tmp_path / "run.toml"
    config.write_text(
        f'[model]\npath = "{model}"\n[algorithm]\ngroup_size = 4\n[rollout.sampling]\nmax_new_tokens = 6\n'
        "[train]\nprompts_per_step = 2\n[train.engine]\nmicro_batch_tokens = 64\nlogit_chunk = 16\nnum_threads = 1\n"
        'lr_schedule = "cosine"\n'
    )
    args = ["bench", "train", "--config", str(config), "--prompt-len", "10", "--steps", "1"]
    result = CliRunner().invoke(main, [*args, "--baseline", "micro_batch_tokens=0", "--baseline", "logit_chunk=0"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["rows"] == 8 and figures["micro_batch_tokens"] == 64 and figures["logit_chunk"] == 16
    assert 0 < figures["of_bfloat16_peak"] and figures["bfloat16_peak_tflops"] > 0
    assert len(figures["places"]) == 3 and all(p["seconds"] >= 0 for p in figures["places"])
    assert figures["speedup_over_baseline"] > 0 and "of the step" in result.output
