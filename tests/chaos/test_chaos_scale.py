"""Chaos at scale, where a lost process takes many replicas with it: 256 emulated rollout
replicas packed 32 to a process (``rollout.pack.<k>``, 8 processes). Mid-run one pack host is killed with -9 (32 replicas
at once): the driver requeues their rows and restarts the pack in place while the other
224 replicas go on. Once it is back, the host of the queue's controllers (``queue``:
``tq.manager`` and every ``tq.controller.<task>``) is killed with -9: the run stops and
resumes itself from its last checkpoint (``cluster.max_resumes``). The run completes with
a clean exactly-once audit (every planned prompt group trained once, with all its rows),
both losses recorded in summary.json (the pack's restart and the automatic resume), and
no process left.

The emulated engines (``rollout.engine.type = "emulated"``, docs/scale.md) load no model:
the replicas and the trainer sleep the cost model's device time of 7B on 910B at
``time_scale = 1e-3``; everything else is the real control plane.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from chaos_helpers import ChaosRun, rng_for
from wf_helpers import read_jsonl

from asyncflow.actors.driver.summary import launches

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

REPLICAS, PER_PROCESS = 256, 32
PACKS = REPLICAS // PER_PROCESS
NUM_STEPS, CHECKPOINT_EVERY = 12, 2
PROMPTS_PER_STEP, GROUP_SIZE = REPLICAS, 2  # one call of one prompt group per replica per step
SLOWEST_STEP_S = 45.0
"""No step may take longer (from the end of the step before, in one launch), the pack's loss and
restart included: a weight sync that waited on each dead replica of the killed pack in turn took
about 3 s per replica, 96 s per version."""

CONFIG = f"""# tests/chaos/test_chaos_scale.py: 256 emulated replicas, 32 to a process
seed = 0

[model]
tiny = "qwen2"
tiny_warm_start = false

[data]
num_prompts = {PROMPTS_PER_STEP * (NUM_STEPS + 2)}

[algorithm]
group_size = {GROUP_SIZE}

[rollout]
num_replicas = {REPLICAS}
prompts_per_call = 1
[rollout.sampling]
max_new_tokens = 16
[rollout.engine]
type = "emulated"
[rollout.engine.emulated]
model = "7b"
hardware = "910b"
time_scale = 1e-3
token_scale = 128
rollout_tp = 1

[reward]
placement = "rollout"
functions = ["asyncflow.toy.tasks:reward"]

[train]
num_steps = {NUM_STEPS}
prompts_per_step = {PROMPTS_PER_STEP}
checkpoint_every = {CHECKPOINT_EVERY}
[train.engine]
type = "emulated"
[train.engine.emulated]
model = "7b"
hardware = "910b"
time_scale = 1e-3
token_scale = 128
train_devices = 8

[workflow]
mode = "async"
staleness = 1
verify_weights = "error"

[cluster]
actors_per_process = {PER_PROCESS}
max_resumes = 2
restart_backoff_s = 0.2

[logging]
progress = true
hang_timeout_s = 60  # a stall is reported (every role's state, the stacks) within the test's waits
"""


def _checkpoint_after(run: ChaosRun, step: int) -> int | None:
    """The step of the first complete checkpoint (``DONE`` written) after ``step`` steps, if any."""
    done = sorted(int(p.parent.name.split("_")[1]) for p in (run.run_dir / "checkpoints").glob("step_*/DONE"))
    return next((s for s in done if s > step), None)


def _cluster_pid(run: ChaosRun, host: str) -> int | None:
    """The pid RUN_DIR/cluster.json gives ``host``: the driver rewrites it once a restart is
    complete (the new process started and every replica in it told StartWork)."""
    try:
        return json.loads((run.run_dir / "cluster.json").read_text())["hosts"].get(host)
    except (OSError, ValueError, KeyError):
        return None


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("seed", [600])
def test_a_pack_of_32_replicas_then_the_queue_killed_at_256_replicas_leaves_every_group_trained_exactly_once(tmp_path, seed):
    rng = rng_for(seed)
    pack = f"rollout.pack.{rng.randrange(PACKS)}"
    kill_step, delay_s = rng.randint(2, 3), rng.uniform(0.0, 1.0)
    run = ChaosRun(
        tmp_path, seed, num_steps=NUM_STEPS, config_text=CONFIG, prompts_per_step=PROMPTS_PER_STEP, group_size=GROUP_SIZE
    )
    t0 = time.monotonic()
    run.start()
    try:
        run.wait_for_step(kill_step)  # step_000002 is saved first: a checkpoint to resume from
        time.sleep(delay_s)
        pid = run.kill(pack)
        killed_at = run.steps_done()
        # the pack is back: a new process, and the driver has told its 32 replicas StartWork
        new_pid = run.wait_until(f"{pack} restarted", lambda: (p := _cluster_pid(run, pack)) and p != pid and p, timeout_s=300)
        restarted_at = run.steps_done()
        assert restarted_at < NUM_STEPS - 4, run.why(f"{pack} came back only after step {restarted_at} of {NUM_STEPS}")
        # a checkpoint after the pack's loss, and a step after it: the resume keeps the steps the loss slowed
        saved = run.wait_until("a checkpoint after the pack's restart", lambda: _checkpoint_after(run, killed_at))
        assert saved < NUM_STEPS - 1, run.why(f"the first checkpoint after the pack's loss is step_{saved:06d}")
        run.wait_for_step(saved + 1)
        time.sleep(rng.uniform(0.0, 1.0))
        run.kill("queue")
        queue_at = run.steps_done()
    except AssertionError as exc:  # the driver's output says what held the run up
        run.kill_everything()
        raise AssertionError(f"{exc}\n--- the driver's output:\n{run.proc.stdout.read()[-30000:]}") from None
    out = run.finish(timeout_s=900)
    wall_s = time.monotonic() - t0
    where = (
        f"{pack} (pid {pid} -> {new_pid}) killed after step {killed_at}, back at {restarted_at}; "
        f"step_{saved:06d} saved; queue killed after {queue_at}"
    )

    assert f"{pack} exited with code -9" in out, run.why(f"{where}:\n{out}")
    assert re.search(r"process 'queue' \(queue\) exited with code -9", out), run.why(f"{where}:\n{out}")
    assert "automatic resume 1 of 2" in out, run.why(f"{where}:\n{out}")
    for bad in (f"restart of {pack} failed", "died during its restart", "could not start its actors"):
        assert bad not in out, run.why(f"{where}: the run printed {bad!r}:\n{out}")

    summary = json.loads((run.run_dir / "summary.json").read_text())
    restarts = [r for r in summary["restarts"] if r["host"] == pack]
    assert [r["exit_code"] for r in restarts] == [-9], run.why(f"{where}: summary.json restarts {summary['restarts']}")
    assert len(summary.get("resumes", [])) == 1 and "queue" in summary["resumes"][0]["error"], run.why(
        f"{where}: summary.json resumes {summary.get('resumes')}"
    )
    gaps = [
        (b["step"], b["time_s"] - a["time_s"])
        for part in launches(read_jsonl(run.run_dir / "metrics.jsonl"))
        for a, b in zip(part, part[1:])
    ]
    step, took = max(gaps, key=lambda g: g[1])
    assert took < SLOWEST_STEP_S, run.why(f"{where}: step {step} took {took:.1f} s (at most {SLOWEST_STEP_S:g} s):\n{out}")
    assert {s for s, _ in gaps} >= set(range(killed_at, saved)), run.why(f"{where}: steps timed {gaps}")
    busy = summary["busy_s"]  # the last launch's stats: every replica worked in it
    assert sorted(n for n in busy if n.startswith("rollout.")) == sorted(f"rollout.{i}" for i in range(REPLICAS)), run.why(where)
    print(
        f"\n{where}; the run took {wall_s:.1f} s, {len(summary['restarts'])} restart(s), {len(summary['resumes'])} resume(s); "
        f"seconds per step: {', '.join(f'{s:.0f}: {t:.1f}' for s, t in gaps)}"
    )
