"""``afctl bench train --share-prompts``: share_prompts off and on side by side on groups of rows sharing a prompt."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from asyncflow.cli.main import main


@pytest.mark.timeout(120)
def test_bench_train_share_prompts_compares_the_two_paths_on_the_same_grouped_batch():
    args = ["bench", "train", "--share-prompts", "--num-rows", "16", "--group-size", "4", "--prompt-len", "20"]
    args += ["--seq-len", "28", "--micro-batch-size", "8", "--steps", "1", "--hidden-size", "32", "--num-layers", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "shared / whole:" in result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    # 4 prompts of 20 tokens once, 16 responses of up to 8: under half the real tokens
    assert figures["shared_tokens_per_step"] < 0.5 * figures["real_tokens_per_step"]
    assert figures["max_loss_diff"] < 1e-5  # the same loss
    assert figures["ratio_shared_to_whole"] > 0 and figures["autocast"] is False


def test_bench_train_share_prompts_refuses_rows_that_do_not_make_whole_groups():
    args = ["bench", "train", "--share-prompts", "--num-rows", "10", "--group-size", "4", "--hidden-size", "32"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "multiple of --group-size" in result.output, result.output
