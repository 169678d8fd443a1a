"""`afctl up` end to end on this machine: real processes, real sockets, a real tiny model; what it
prints and leaves behind (the async case also checks what test_quiet_run.py did)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from wf_helpers import afctl, assert_trained_exactly_once, child_hosts, read_jsonl, wait_for_steps, write_config

JUDGE = f"""
[[roles]]
name = "judge"
cls = "brevity_judge:BrevityJudge"
task = "judge"
reward_column = "judge_score"
kwargs = {{ target_tokens = 2 }}
[cluster]
python_path = ["{Path(__file__).resolve().parents[2] / "examples" / "roles"}"]
"""


@pytest.mark.timeout(240)
# sync: -m slow (suite time); sync whole runs stay in the default suite through test_overlong_run and
# test_dynamic_sampling_run
@pytest.mark.parametrize("mode,staleness", [pytest.param("sync", 0, marks=pytest.mark.slow), ("async", 1)])
def test_a_few_steps_run_end_to_end_and_staleness_never_exceeds_k(tmp_path, mode, staleness, request):
    run_dir = tmp_path / "run"
    # the async run also carries a custom role (the example brevity judge) whose score the trainer adds
    judge = JUDGE if mode == "async" else ""
    tmp = Path(tempfile.mkdtemp(prefix="afq-", dir="/tmp"))  # the run's TMPDIR: short, as ipc socket paths must be
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    proc = afctl(
        "up",
        str(write_config(tmp_path, mode=mode, num_steps=4, staleness=staleness, extra=judge)),
        "--run-dir",
        str(run_dir),
        env_extra={"TMPDIR": str(tmp)},
    )
    out, _ = proc.communicate(timeout=220)
    assert proc.returncode == 0, out
    assert "done: 4 steps" in out
    # what it prints: what starts, and no progress bars of the libraries that load and save the model
    assert "Loading weights" not in out and "Writing model shards" not in out, out
    roles = "queue, shard.0, loader, rollout.0, reward.0, " + ("judge, " if judge else "") + "trainer"
    assert f"starting {6 + bool(judge)} processes: {roles}" in out, out
    assert "waiting for the first step" in out, out
    assert [p.name for p in tmp.iterdir() if p.name.startswith("af-")] == []  # the ipc directory is removed
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [int(m["step"]) for m in metrics] == [0, 1, 2, 3]
    assert all(m["staleness_max"] <= staleness for m in metrics)
    assert all(m["samples"] == 4 for m in metrics)
    # the trainer asked for steps 1.. while the step before trained (workflow.prefetch_batch), never for step 0
    assert metrics[0]["batch_prefetched"] == 0 and sum(m["batch_prefetched"] for m in metrics) >= 1, metrics
    # version integrity: every row checked against its tag's weights digest, none off
    assert all(m["weights_mismatch"] == 0 and m["weights_unverified"] == 0 for m in metrics)
    trained = read_jsonl(run_dir / "trained.jsonl")
    assert all(rec["step"] - v <= staleness for rec in trained for v in rec["versions"])
    assert_trained_exactly_once(run_dir, 4, 2, 2)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mode"] == mode and summary["restarts"] == []
    if judge:
        assert summary["busy_s"]["judge"] > 0
        # the role's own figures per step: its score's mean (before reward_weight) and its busy fraction
        assert all(-1.0 < m["score/judge_score"] <= 0.0 for m in metrics), metrics
        assert all("busy/judge" in m for m in metrics if any(k.startswith("busy/") for k in m))
    final = Path(summary["checkpoint"])
    assert (final / "model" / "config.json").exists() and (final / "DONE").read_text().strip() == "4"
    trace = json.loads((run_dir / "trace.json").read_text())
    assert {"rollout.0", "trainer", "reward.0", "loader"} <= {
        e["args"]["name"].split()[0] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"
    }
    # what the model writes, as text: each step's first rows (logging.samples_every = 1, samples_per_step = 2)
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert [s["step"] for s in samples] == [0, 0, 1, 1, 2, 2, 3, 3] and all(isinstance(s["response"], str) for s in samples)
    assert {s["finish"] for s in samples} <= {"stop", "length"}
    assert all(s["step"] - staleness <= s["version"] <= s["step"] for s in samples), samples
    # the run directory is its user's alone (docs/security.md): 0700, and nothing in it readable by others
    assert run_dir.stat().st_mode & 0o777 == 0o700
    shared = [str(p) for p in run_dir.rglob("*") if not p.is_symlink() and p.stat().st_mode & 0o077]
    assert shared == [], shared[:5]


@pytest.mark.timeout(300)
def test_killed_rollout_and_custom_role_processes_are_restarted_and_every_sample_is_trained_exactly_once(tmp_path):
    run_dir, gate = tmp_path / "run", tmp_path / "gate"
    # the judge holds after 4 steps' rows (2 prompts x 2 samples each) until the gate exists: the kills land
    # mid-run however fast the steps go (they take ~20 ms: 30 of them once could end before the kill)
    judge = JUDGE.replace('"brevity_judge:BrevityJudge"', '"wf_gated_judge:GatedJudge"')
    judge = judge.replace("target_tokens = 2 }", f'target_tokens = 2, gate = "{gate}", hold_after = 16 }}')
    judge = judge.replace("python_path = [", f'python_path = ["{Path(__file__).resolve().parent}", ')
    config = write_config(tmp_path, num_steps=30, extra=judge)
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    wait_for_steps(run_dir, proc, 2, 200)
    hosts = child_hosts(proc.pid)
    assert {"rollout.0", "judge"} <= set(hosts), f"no rollout.0 or judge process under {proc.pid}: {hosts}"
    os.kill(hosts["rollout.0"], signal.SIGKILL)
    os.kill(hosts["judge"], signal.SIGKILL)  # a custom role is restarted the same way
    assert len(read_jsonl(run_dir / "metrics.jsonl")) < 30  # held by the judge: the kills landed mid-run
    gate.touch()  # the restarted judge scores on
    out, _ = proc.communicate(timeout=250)
    assert proc.returncode == 0, out
    assert "rollout.0 exited with code -9" in out and "judge exited with code -9" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sorted(r["host"] for r in summary["restarts"]) == ["judge", "rollout.0"]
    assert_trained_exactly_once(run_dir, 30, 2, 2)


@pytest.mark.timeout(300)
def test_resume_continues_with_the_next_step_and_the_same_queue_contents(tmp_path):
    run_dir = tmp_path / "run"
    # far longer than the test, so only the interrupt can end the first run: tiny steps take milliseconds,
    # and 40 of them once all ran before the interrupt landed on a fast machine (the run exited 0, not 130)
    config = write_config(tmp_path, num_steps=100_000, checkpoint_every=2)
    # its own process group, like a job in a terminal: Ctrl-C reaches the driver and every host
    # (the stop itself is checked as test_ctrl_c_stops_every_process does, which runs with -m slow)
    first = afctl("up", str(config), "--run-dir", str(run_dir), start_new_session=True)
    wait_for_steps(run_dir, first, 3, 200)  # the checkpoint after step index 1 (version 2) is written
    children = list(child_hosts(first.pid).values())
    os.killpg(first.pid, signal.SIGINT)
    out, _ = first.communicate(timeout=60)
    _assert_stopped_by_the_signal(first, out, children, run_dir)
    assert "afctl up --resume" in out
    # wherever the interrupt landed, the resumed run trains a few steps past its last checkpoint and ends
    from asyncflow.actors.trainer.checkpoints import done_step, latest_checkpoint

    latest = latest_checkpoint(run_dir)
    checkpointed = done_step(latest) if latest is not None else None
    assert checkpointed is not None and checkpointed >= 2, f"no complete checkpoint in {run_dir / 'checkpoints'}"
    steps = checkpointed + 6
    second = afctl("up", "--resume", str(run_dir), "--set", f"train.num_steps={steps}")
    out, _ = second.communicate(timeout=220)
    assert second.returncode == 0, out
    assert "resumed the queue" in out
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [int(m["step"]) for m in metrics] == list(range(steps))
    assert_trained_exactly_once(run_dir, steps, 2, 2)


@pytest.mark.timeout(200)
# -m slow (suite time): the default suite stops a run with Ctrl-C in test_resume_continues_with_the_next_step...
@pytest.mark.parametrize("how", [pytest.param("ctrl_c", marks=pytest.mark.slow), pytest.param("sigterm", marks=pytest.mark.slow)])
def test_ctrl_c_stops_every_process(tmp_path, how):
    run_dir = tmp_path / "run"
    # its own process group, like a job in a terminal: Ctrl-C reaches the driver and every host. The run is
    # far longer than the test (tiny steps take milliseconds: 50 of them once ended before the signal on a
    # loaded machine), so only the signal can end it.
    proc = afctl("up", str(write_config(tmp_path, num_steps=100_000)), "--run-dir", str(run_dir), start_new_session=True)
    wait_for_steps(run_dir, proc, 1, 180)
    children = list(child_hosts(proc.pid).values())
    assert len(children) >= 5
    if how == "ctrl_c":
        os.killpg(proc.pid, signal.SIGINT)
    else:  # `kill DRIVER_PID`, or a scheduler cancelling the job: the driver alone gets SIGTERM
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    _assert_stopped_by_the_signal(proc, out, children, run_dir)


def _assert_stopped_by_the_signal(proc, out: str, children: list[int], run_dir: Path) -> None:
    assert proc.returncode == 130, out
    # the driver stops the roles in order: no role fails because the queue vanished under it
    assert "failed" not in out and "Traceback" not in out, out
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], pid
    summary = json.loads((run_dir / "summary.json").read_text())  # what ran until the stop, marked as such
    assert summary["interrupted"] is True and summary["steps"] >= 1, summary
