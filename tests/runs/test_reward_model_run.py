"""The reward-model role in a real run (`afctl up` on the tiny config, the tiny reward
model trained in the run directory): its score reaches the trainer's reward, in sync
mode and in async mode with two trainer ranks, and every group is trained once.

The reward functions' weight is 0 here, so the whole reward is ``weight x rm_score``:
a run that ignored the column would have a reward of 0 in every step."""

from __future__ import annotations

import pytest
from wf_helpers import afctl, assert_trained_exactly_once, read_jsonl, write_config

WEIGHT = 2.0


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode,num_ranks", [("sync", 1), ("async", 2)])
def test_the_reward_models_score_is_the_trainers_reward_in_every_step(tmp_path, mode, num_ranks):
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path,
        mode=mode,
        num_steps=3,
        staleness=0 if mode == "sync" else 1,
        changes={
            "reward": {"weights": [0.0]},
            "reward_model": {"enabled": True, "tiny_steps": 30, "weight": WEIGHT, "batch_size": 3},
            "train": {"num_ranks": num_ranks},
            "train.engine": {"fsdp": num_ranks > 1},
        },
    )
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=280)
    assert proc.returncode == 0, out
    assert "reward_model.0" in out and (run_dir / "reward_model" / "config.json").is_file()
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert len(metrics) == 3
    for m in metrics:
        assert m["score/rm_score"] != 0.0, m
        assert m["reward_mean"] != 0.0, m  # the functions give 0: all of it is the reward model's
        if num_ranks == 1:  # score/rm_score is rank 0's rows, reward_mean every rank's
            assert m["reward_mean"] == pytest.approx(WEIGHT * m["score/rm_score"], rel=1e-5), m
    assert_trained_exactly_once(run_dir, 3, 2, 2)
