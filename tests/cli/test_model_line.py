"""The run's last line says where the trained model is and how to load it; for a LoRA
run, not the frozen base weights as if they were trained."""

from __future__ import annotations

import pytest

from asyncflow.cli.up import model_line

pytestmark = pytest.mark.timeout(10)


def test_a_full_run_points_at_the_checkpoint_and_latest(tmp_path):
    ckpt = tmp_path / "checkpoints" / "step_000004"
    (ckpt / "model").mkdir(parents=True)
    line = model_line(str(ckpt))
    assert line.startswith(f"model: {ckpt / 'model'} (also {tmp_path / 'checkpoints' / 'latest'}; load it with transformers")


def test_a_lora_run_says_the_model_directory_alone_is_untrained_and_how_to_load_the_adapter(tmp_path):
    ckpt = tmp_path / "checkpoints" / "step_000004"
    (ckpt / "model" / "adapter").mkdir(parents=True)
    line = model_line(str(ckpt))
    assert "from_pretrained on it alone gives the untrained model" in line and "peft" in line
    assert "save_merged = true" in line
    (ckpt / "model" / "merged").mkdir()
    assert model_line(str(ckpt)).startswith(f"model: {ckpt / 'model' / 'merged'} (LoRA, base + adapter merged")
