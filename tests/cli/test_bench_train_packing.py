"""``afctl bench train --packing``: packing on and off side by side on a long-tailed batch."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from asyncflow.cli.main import main


@pytest.mark.timeout(120)
def test_bench_train_packing_compares_packed_and_padded_steps_on_the_same_batch():
    args = ["bench", "train", "--packing", "--num-rows", "32", "--seq-len", "64", "--micro-batch-size", "8", "--steps", "1"]
    args += ["--hidden-size", "32", "--num-layers", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "packed / padded:" in result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["packed_fed_tokens_per_step"] < 0.6 * figures["padded_fed_tokens_per_step"]
    assert figures["real_tokens_per_step"] <= figures["packed_fed_tokens_per_step"]
    assert figures["max_loss_diff"] < 1e-5
    assert figures["pack_attention"] == "position_ids"
    assert figures["ratio_packed_to_padded"] > 0
