"""Sequence packing in a real run (``[train.engine] packing = true``): a sync run with
packing trains on the same losses step by step as the same run without it, and an
async run with two FSDP ranks, a PPO critic and a KL reference, all packing, trains."""

from __future__ import annotations

from pathlib import Path

import pytest
from wf_helpers import afctl, assert_trained_exactly_once, read_jsonl, write_config

HERE = Path(__file__).parent
PYTHON_PATH = f"""
[cluster]
python_path = ["{HERE}"]
"""


def _run(tmp_path: Path, name: str, mode: str, changes: dict) -> list[dict]:
    base = {
        "reward": {"functions": ["wf_rewards:length"]},  # varied rewards: real gradients
        "rollout.sampling": {"max_new_tokens": 12},  # responses of different lengths
    }
    config_dir = tmp_path / f"{name}_config"
    config_dir.mkdir()
    config = write_config(
        config_dir,
        mode=mode,
        num_steps=3,
        staleness=0 if mode == "sync" else 1,
        extra=PYTHON_PATH,
        changes={**base, **changes},
    )
    run_dir = tmp_path / name
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    return read_jsonl(run_dir / "metrics.jsonl")


@pytest.mark.slow  # two tiny runs, about 40 s on 2 cores
@pytest.mark.timeout(330)
def test_a_sync_run_with_packing_trains_on_the_losses_of_the_same_run_without_it(tmp_path):
    runs = {}
    for packing in (False, True):
        engine = {"micro_batch_size": 2, "packing": packing}
        runs[packing] = _run(tmp_path, f"packing_{packing}", "sync", {"train.engine": engine})
    assert any(m["loss"] != 0.0 for m in runs[False])
    for off, on in zip(runs[False], runs[True], strict=True):
        assert on["loss"] == pytest.approx(off["loss"], abs=1e-5)
        assert on["grad_norm"] == pytest.approx(off["grad_norm"], rel=1e-3)


@pytest.mark.slow  # about 30 s on 2 cores
@pytest.mark.timeout(200)
def test_an_async_run_with_two_ranks_a_critic_and_a_reference_all_packing_trains(tmp_path):
    changes = {
        "algorithm": {"name": "ppo", "kl_coef": 0.01},
        "train": {"num_ranks": 2},
        "train.engine": {"fsdp": True, "packing": True, "micro_batch_size": 1},
        "critic.engine": {"fsdp": True, "packing": True},
    }
    metrics = _run(tmp_path, "run", "async", changes)
    assert len(metrics) == 3 and any(m["loss"] != 0.0 for m in metrics)
    assert all(m["num_ranks"] == 2 for m in metrics)
    assert_trained_exactly_once(tmp_path / "run", 3, 2, 2)
