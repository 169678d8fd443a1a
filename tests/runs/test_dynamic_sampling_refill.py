"""Dynamic sampling with refill (``algorithm.dynamic_sampling_max_rounds``) in real runs.

The prompts are written by the test: prompt k's answer is even (every response gets
the same reward from ``wf_rewards:constant_for_even_answers``: a group of equal
rewards) unless k is a multiple of 3 plus 2. Every allocation is one round of
``groups_per_step = 3`` groups (2 prompts per step, over-sampled 1.5x), the queue
numbers groups 0, 1, 2, ... in allocation order, and every prompt position of a
round (first or refill) is congruent to its group's place in the round modulo 3, as
is the pool's size: so a group's kind is known from its id alone (``group_id % 3 ==
2``: informative), without trusting the trainer. Each round holds exactly one
informative group: a step fills its batch of 2 only with one refill round.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from wf_helpers import afctl, read_jsonl, wait_for_steps, write_config

HERE = Path(__file__).parent
NUM_STEPS = 4
PROMPTS_PER_STEP = 2
GROUP_SIZE = 2
GROUPS_PER_STEP = 3  # ceil(2 x 1.5)
POOL = 12  # a multiple of GROUPS_PER_STEP


def informative(group: int) -> bool:
    return group % GROUPS_PER_STEP == 2


def write_prompts(path: Path) -> Path:
    """Prompt k: 'a+b=' with an odd sum iff k % 3 == 2 (the tiny tokenizer's alphabet)."""
    with path.open("w") as f:
        for k in range(POOL):
            a = k % 5
            b = 1 if (a + 1) % 2 == informative(k) else 2
            assert ((a + b) % 2 == 1) == informative(k)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    return path


def refill_config(tmp_path: Path, data: Path, mode: str, num_steps: int, max_rounds: int, **keys) -> Path:
    """A dynamic-sampling run with refill over ``data`` (``keys``: more tables, as write_config's changes;
    ``checkpoint_every``)."""
    checkpoint_every = keys.pop("checkpoint_every", 0)
    return write_config(
        tmp_path,
        mode=mode,
        num_steps=num_steps,
        staleness=0 if mode == "sync" else 1,
        checkpoint_every=checkpoint_every,
        extra=f'\n[cluster]\npython_path = ["{HERE}"]\n',
        changes={
            "data": {"path": str(data), "shuffle": False},
            "reward": {"functions": ["wf_rewards:constant_for_even_answers"]},
            "algorithm": {
                "dynamic_sampling": True,
                "dynamic_sampling_oversample": 1.5,
                "dynamic_sampling_max_rounds": max_rounds,
                "group_size": GROUP_SIZE,
            },
            **keys,
        },
    )


def run(tmp_path: Path, mode: str, num_ranks: int, max_rounds: int, workflow: dict | None = None):
    run_dir = tmp_path / "run"
    data = write_prompts(tmp_path / "prompts.jsonl")
    config = refill_config(
        tmp_path,
        data,
        mode,
        NUM_STEPS,
        max_rounds,
        train={"num_ranks": num_ranks, "prompts_per_step": PROMPTS_PER_STEP},
        **{"train.engine": {"fsdp": num_ranks > 1}},
        workflow=workflow or {},
    )
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=170)
    assert proc.returncode == 0, out
    answers = [int(r["answer"]) for r in read_jsonl(data)]
    assert all((a % 2 == 1) == informative(k) for k, a in enumerate(answers))  # the data says each group's kind
    return read_jsonl(run_dir / "trained.jsonl"), read_jsonl(run_dir / "metrics.jsonl")


def check_exactly_once(trained: list[dict], num_groups: int) -> None:
    """Every group the loader allocated (0 .. num_groups - 1, of every round) and each
    of its rows is trained or dropped at exactly one step."""
    groups: list[int] = []
    rows: list[int] = []
    for t in trained:
        groups += list(dict.fromkeys(t["groups"])) + t["filtered_groups"] + t["surplus_groups"]
        rows += t["indices"] + t["dropped"]
    assert sorted(groups) == list(range(num_groups))
    assert sorted(rows) == list(range(num_groups * GROUP_SIZE))


def check_refilled_run(trained: list[dict], metrics: list[dict], num_ranks: int) -> None:
    assert [t["step"] for t in trained] == list(range(NUM_STEPS)) and len(metrics) == NUM_STEPS
    for t, m in zip(trained, metrics):
        groups = list(dict.fromkeys(t["groups"]))
        # a full batch of informative groups, each from a different round of the step
        assert len(groups) == PROMPTS_PER_STEP and all(informative(g) for g in groups), t
        assert t["padded_groups"] == [] and t["surplus_groups"] == [], t
        assert all(not informative(g) for g in t["filtered_groups"]) and len(t["filtered_groups"]) == 4, t
        assert sorted(t["ranks"]) == sorted(r for r in range(num_ranks) for _ in range(len(t["indices"]) // num_ranks))
        assert m["refill_rounds"] == 1 and m["refill_groups"] == GROUPS_PER_STEP and m["refill_short"] == 0, m
        assert m["kept_groups"] == PROMPTS_PER_STEP and m["samples"] == PROMPTS_PER_STEP * GROUP_SIZE, m
        assert m["filtered_frac"] == pytest.approx(4 / 6), m
    check_exactly_once(trained, NUM_STEPS * 2 * GROUPS_PER_STEP)


@pytest.mark.slow  # about 30 s on 2 cores (loaded)
@pytest.mark.timeout(180)
def test_refill_in_sync_mode_fills_every_step_with_informative_groups_each_trained_or_dropped_once(tmp_path):
    trained, metrics = run(tmp_path, "sync", 1, max_rounds=2)
    check_refilled_run(trained, metrics, num_ranks=1)
    assert all(m["staleness_max"] == 0 for m in metrics)


@pytest.mark.slow  # about 40 s on 2 cores: two FSDP ranks
@pytest.mark.timeout(180)
def test_refill_in_async_mode_with_two_ranks_fills_every_step_within_the_staleness_bound(tmp_path):
    trained, metrics = run(tmp_path, "async", 2, max_rounds=2)
    check_refilled_run(trained, metrics, num_ranks=2)
    assert all(m["staleness_max"] <= 1 for m in metrics)


@pytest.mark.slow  # about 30 s on 2 cores
@pytest.mark.timeout(180)
def test_refill_with_partial_rollout_fills_every_step(tmp_path):
    trained, metrics = run(tmp_path, "async", 1, max_rounds=2, workflow={"partial_rollout": True})
    check_refilled_run(trained, metrics, num_ranks=1)
    assert all(m["staleness_max"] <= 1 for m in metrics)


@pytest.mark.slow  # about 30 s on 2 cores (loaded)
@pytest.mark.timeout(180)
def test_without_refill_a_step_short_of_informative_groups_trains_fewer(tmp_path):
    trained, metrics = run(tmp_path, "sync", 1, max_rounds=0)
    for t, m in zip(trained, metrics):
        groups = list(dict.fromkeys(t["groups"]))
        assert len(groups) == 1 < PROMPTS_PER_STEP and informative(groups[0]), t
        assert "refill_rounds" not in m
    check_exactly_once(trained, NUM_STEPS * GROUPS_PER_STEP)


@pytest.mark.slow  # about 60 s on 2 cores: a run interrupted after a checkpoint, then resumed
@pytest.mark.timeout(300)
def test_a_refilled_run_resumed_mid_run_trains_or_drops_every_group_once_with_full_steps(tmp_path):
    run_dir = tmp_path / "run"
    num_steps = 20
    data = write_prompts(tmp_path / "prompts.jsonl")
    config = refill_config(
        tmp_path, data, "async", num_steps, 2, checkpoint_every=2, train={"prompts_per_step": PROMPTS_PER_STEP}
    )
    first = afctl("up", str(config), "--run-dir", str(run_dir))
    wait_for_steps(run_dir, first, 3, 200)  # the checkpoint after step index 1 is written
    first.send_signal(signal.SIGINT)
    out, _ = first.communicate(timeout=60)
    assert "afctl up --resume" in out, out
    second = afctl("up", "--resume", str(run_dir))
    out, _ = second.communicate(timeout=220)
    assert second.returncode == 0, out
    trained, metrics = read_jsonl(run_dir / "trained.jsonl"), read_jsonl(run_dir / "metrics.jsonl")
    assert [t["step"] for t in trained] == list(range(num_steps)) == [int(m["step"]) for m in metrics]
    for t in trained:
        groups = list(dict.fromkeys(t["groups"]))
        assert len(groups) == PROMPTS_PER_STEP and all(informative(g) for g in groups), t
    check_exactly_once(trained, num_steps * 2 * GROUPS_PER_STEP)
