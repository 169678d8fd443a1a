"""LoRA in real runs (``[train.engine.lora] rank > 0``): the policy trains through its
adapters in sync and async mode (two FSDP ranks), each weight sync carries only the
adapters (``weight_bytes``), every row's weights digest checks out against the merged
weights the replica generated with, and a run resumes from its LoRA checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
from wf_helpers import afctl, assert_trained_exactly_once, read_jsonl, write_config

HERE = Path(__file__).parent
PYTHON_PATH = f"""
[cluster]
python_path = ["{HERE}"]
"""
LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def _up(tmp_path: Path, name: str, mode: str, changes: dict, num_steps: int = 3) -> Path:
    base = {"reward": {"functions": ["wf_rewards:length"]}, "rollout.sampling": {"max_new_tokens": 8}}
    config_dir = tmp_path / f"{name}_config"
    config_dir.mkdir()
    config = write_config(
        config_dir,
        mode=mode,
        num_steps=num_steps,
        staleness=0 if mode == "sync" else 1,
        extra=PYTHON_PATH,
        changes={**base, **changes},
    )
    run_dir = tmp_path / name
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    return run_dir


def _full_model_bytes(run_dir: Path) -> int:
    model = run_dir / "checkpoints" / "latest" / "model.safetensors"
    return sum(t.numel() * t.element_size() for t in safetensors.torch.load_file(model).values())


def _check(metrics: list[dict], run_dir: Path) -> None:
    assert any(m["loss"] != 0.0 for m in metrics)
    assert all(m["weights_mismatch"] == 0 for m in metrics)
    assert sum(m["samples"] - m["weights_unverified"] for m in metrics) > 0  # rows were checked, not skipped
    assert all(0 < m["weight_bytes"] * 10 <= _full_model_bytes(run_dir) for m in metrics)
    assert (run_dir / "checkpoints" / "latest" / "adapter" / "adapter_config.json").is_file()


@pytest.mark.slow  # three tiny runs, about 60 s on 2 cores
@pytest.mark.timeout(400)
def test_a_sync_lora_run_syncs_adapters_only_verifies_every_row_and_resumes_from_its_checkpoint(tmp_path):
    changes = {"train.engine.lora": LORA, "workflow": {"verify_weights": "count"}}
    run_dir = _up(tmp_path, "lora", "sync", changes)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    _check(metrics, run_dir)
    off = read_jsonl(_up(tmp_path, "full", "sync", {"workflow": {"verify_weights": "count"}}) / "metrics.jsonl")
    assert off[0]["weight_bytes"] >= 10 * metrics[0]["weight_bytes"]
    # resumed: replicas start on the checkpoint's base + adapter; "error" fails the step if a row's digest disagrees
    resumed = afctl("up", "--resume", str(run_dir), "--set", "train.num_steps=5")
    out, _ = resumed.communicate(timeout=150)
    assert resumed.returncode == 0, out
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [int(m["step"]) for m in metrics] == [0, 1, 2, 3, 4]
    assert all(m["weights_mismatch"] == 0 for m in metrics[3:])
    assert sum(m["samples"] - m["weights_unverified"] for m in metrics[3:]) > 0


@pytest.mark.slow  # about 35 s on 2 cores
@pytest.mark.timeout(240)
def test_an_async_lora_run_with_two_fsdp_ranks_trains_and_verifies_every_row(tmp_path):
    changes = {
        "train": {"num_ranks": 2},
        "train.engine": {"fsdp": True, "micro_batch_size": 1},
        "train.engine.lora": {**LORA, "train_norms": True},  # norms gathered whole from their FSDP shards
        "workflow": {"verify_weights": "count"},
    }
    run_dir = _up(tmp_path, "run", "async", changes)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert all(m["num_ranks"] == 2 for m in metrics)
    _check(metrics, run_dir)
    assert_trained_exactly_once(run_dir, 3, 2, 2)
