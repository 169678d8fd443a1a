"""Dynamic sampling (DAPO) in a real run (`afctl up` on the tiny config).

The reward (``wf_rewards:constant_for_even_answers``) gives every response of a
prompt with an even answer the same reward, and random rewards otherwise, so which
groups carry a gradient is known from the prompt alone. With ``data.shuffle = false``
and no held-out split, group g (the queue numbers groups in allocation order) is
prompt g of RUN_DIR/data.jsonl: the test knows each group's kind without trusting
the trainer. With dynamic sampling on, the trainer trains only groups of odd answers
(save the groups trained to give each rank one, which it declares), and every
over-sampled group is trained or dropped exactly once; with it off, groups of equal
rewards are trained.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from wf_helpers import afctl, read_jsonl, write_config

HERE = Path(__file__).parent
PYTHON_PATH = f"""
[cluster]
python_path = ["{HERE}"]
"""

NUM_STEPS = 4
PROMPTS_PER_STEP = 2
GROUP_SIZE = 2


def run(tmp_path, mode: str, num_ranks: int, dynamic: bool, oversample: float = 2.0):
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path,
        mode=mode,
        num_steps=NUM_STEPS,
        staleness=0 if mode == "sync" else 1,
        extra=PYTHON_PATH,
        changes={
            "data": {"shuffle": False},
            "reward": {"functions": ["wf_rewards:constant_for_even_answers"]},
            "algorithm": {"dynamic_sampling": dynamic, "dynamic_sampling_oversample": oversample, "group_size": GROUP_SIZE},
            "train": {"num_ranks": num_ranks, "prompts_per_step": PROMPTS_PER_STEP},
            "train.engine": {"fsdp": num_ranks > 1},
        },
    )
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=170)
    assert proc.returncode == 0, out
    answers = [int(r["answer"]) for r in read_jsonl(run_dir / "data.jsonl")]
    equal_rewards = lambda group: answers[group % len(answers)] % 2 == 0  # noqa: E731
    return read_jsonl(run_dir / "trained.jsonl"), read_jsonl(run_dir / "metrics.jsonl"), equal_rewards


def check_dynamic_run(trained, metrics, equal_rewards, groups_per_step: int, num_ranks: int) -> None:
    assert [t["step"] for t in trained] == list(range(NUM_STEPS))
    assert len(metrics) == NUM_STEPS
    seen_groups: list[int] = []
    seen_rows: list[int] = []
    for t, m in zip(trained, metrics):
        groups = list(dict.fromkeys(t["groups"]))
        # only informative groups are trained, save those padded in to give every rank a group
        assert [g for g in groups if equal_rewards(g)] == t["padded_groups"], t
        assert all(equal_rewards(g) for g in t["filtered_groups"]), t
        assert not any(equal_rewards(g) for g in t["surplus_groups"]), t
        assert 1 <= len(groups) <= PROMPTS_PER_STEP and len(groups) % num_ranks == 0, t
        assert sorted(t["ranks"]) == sorted(r for r in range(num_ranks) for _ in range(len(t["indices"]) // num_ranks))
        # a full batch whenever the step had enough informative groups
        if len(t["surplus_groups"]) > 0:
            assert len(groups) == PROMPTS_PER_STEP, t
        seen_groups += groups + t["filtered_groups"] + t["surplus_groups"]
        seen_rows += t["indices"] + t["dropped"]
        assert m["filtered_frac"] == pytest.approx(len(t["filtered_groups"]) / groups_per_step)
        assert m["kept_groups"] == len(groups) and m["samples"] == len(t["indices"]) == len(groups) * GROUP_SIZE
        assert m["surplus_groups"] == len(t["surplus_groups"]) and m["padded_groups"] == len(t["padded_groups"])
    # exactly once: every over-sampled group of every step is trained or dropped, once, with all its rows
    assert sorted(seen_groups) == list(range(NUM_STEPS * groups_per_step))
    assert len(seen_rows) == len(set(seen_rows)) == NUM_STEPS * groups_per_step * GROUP_SIZE
    assert any(m["filtered_frac"] > 0 for m in metrics), metrics


@pytest.mark.timeout(180)
def test_dynamic_sampling_in_sync_mode_trains_only_informative_groups_and_drops_each_other_group_once(tmp_path):
    trained, metrics, equal_rewards = run(tmp_path, "sync", 1, dynamic=True)
    check_dynamic_run(trained, metrics, equal_rewards, groups_per_step=2 * PROMPTS_PER_STEP, num_ranks=1)
    assert all(m["staleness_max"] == 0 for m in metrics)


@pytest.mark.slow  # about 40 s on 2 cores: two FSDP ranks
@pytest.mark.timeout(180)
def test_dynamic_sampling_in_async_mode_with_two_ranks_trains_only_informative_groups_once(tmp_path):
    oversample = 2.5
    trained, metrics, equal_rewards = run(tmp_path, "async", 2, dynamic=True, oversample=oversample)
    check_dynamic_run(trained, metrics, equal_rewards, math.ceil(PROMPTS_PER_STEP * oversample), num_ranks=2)
    assert all(m["staleness_max"] <= 1 for m in metrics)


@pytest.mark.slow  # about 20 s on 2 cores
@pytest.mark.timeout(180)
def test_without_dynamic_sampling_groups_of_equal_rewards_are_trained(tmp_path):
    trained, metrics, equal_rewards = run(tmp_path, "sync", 1, dynamic=False)
    groups = [g for t in trained for g in dict.fromkeys(t["groups"])]
    assert sorted(groups) == list(range(NUM_STEPS * PROMPTS_PER_STEP))
    assert any(equal_rewards(g) for g in groups)
    assert all("filtered_frac" not in m and "dropped" not in t for t, m in zip(trained, metrics))
