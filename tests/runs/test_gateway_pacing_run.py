"""Pacing the agents of a run that trains on gateway sessions: an agent written without
asyncflow (examples/agent/agent.py) that keeps many sessions in flight outruns the
trainer. Paced (``[rollout.gateway] pace``, the default), new sessions wait for room and
at most 5% are discarded as stale; unpaced, far more are. A run whose agents stopped
sending saves, says so and ends (``[rollout.gateway] idle_end_s``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_gateway_sessions_run import wait_for_gateway, wait_for_line
from wf_helpers import afctl, read_jsonl, write_config

AGENT = Path(__file__).resolve().parents[2] / "examples" / "agent" / "agent.py"

SESSIONS_PER_STEP = 8  # 2 groups of 4 attempts


def sessions_config(tmp_path: Path, num_sessions: int, gateway: dict):
    return write_config(
        tmp_path,
        staleness=1,
        num_steps=1,
        changes={
            "algorithm": {"group_size": 4},
            "train": {"prompts_per_step": 2},
            "rollout.gateway": {"enabled": True, "port": 0, "train": True, "num_sessions": num_sessions, **gateway},
            "reward": {"functions": []},
        },
    )


def start_agent(url: str, log: Path, problems: int, concurrency: int) -> subprocess.Popen:
    """examples/agent/agent.py against the run: ``concurrency`` problems of 4 attempts in flight, each
    as soon as the one before it is done; it stops when the run stops answering."""
    return subprocess.Popen(
        [sys.executable, str(AGENT), "--base-url", url, "--problems", str(problems), "--attempts", "4"]
        + ["--concurrency", str(concurrency), "--max-turns", "2", "--log", str(log)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # nothing of asyncflow in its process
    )


def discarded_fraction(run_dir: Path) -> tuple[int, int]:
    lines = read_jsonl(run_dir / "trained.jsonl")
    trained = sum(len(line["indices"]) for line in lines)
    stale = sum(len(line["stale_sessions"]) for line in lines)
    return trained, stale


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("pace", [True, False], ids=["paced", "unpaced"])
def test_an_agent_that_outruns_the_trainer_loses_at_most_5_percent_of_its_sessions_when_paced(tmp_path, pace):
    run_dir = tmp_path / "run"
    num_sessions = 12 * SESSIONS_PER_STEP
    gateway = {} if pace else {"pace": False}  # paced by default
    proc = afctl("up", str(sessions_config(tmp_path, num_sessions, gateway)), "--run-dir", str(run_dir))
    agent = None
    try:
        url = wait_for_gateway(run_dir, proc)
        # 8 problems x 4 attempts in flight: 32 sessions, 4 steps' worth, against workflow.staleness = 1
        agent = start_agent(url, tmp_path / "agent.jsonl", problems=1000, concurrency=8)
        out, _ = proc.communicate(timeout=480)  # the run ends by itself after num_sessions
        agent.wait(timeout=120)  # and the agent stops when the gateway does
    finally:
        for p in (proc, agent):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGINT)
                p.communicate(timeout=60)
    assert proc.returncode == 0, out
    trained, stale = discarded_fraction(run_dir)
    assert trained == num_sessions, out
    frac = stale / (trained + stale)
    assert "discarded as stale" in out and f"{trained} trained, {stale} discarded" in out, out  # the run's last lines
    if pace:
        assert frac <= 0.05, f"{stale} of {trained + stale} sessions discarded as stale ({frac:.0%}) with pacing"
    else:  # the same agent, unpaced: it runs steps ahead and its work is thrown away
        assert frac >= 0.25, f"only {stale} of {trained + stale} sessions discarded without pacing: the agent did not outrun"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_whose_agent_stopped_sending_saves_says_so_and_ends(tmp_path):
    run_dir = tmp_path / "run"
    config = sessions_config(tmp_path, 8 * SESSIONS_PER_STEP, {"idle_end_s": 8.0})
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    try:
        url = wait_for_gateway(run_dir, proc)
        wait_for_line(proc, "every process is up")
        agent = start_agent(url, tmp_path / "agent.jsonl", problems=4, concurrency=2)  # 16 sessions: 2 steps, then it stops
        assert agent.wait(timeout=180) == 0, agent.stderr.read()
        out, _ = proc.communicate(timeout=180)  # ends by itself, 6 steps short of num_sessions
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "ended early: no rewarded session reached the queue for 8 s ([rollout.gateway] idle_end_s)" in out, out
    assert len(read_jsonl(run_dir / "trained.jsonl")) == 2
    assert (run_dir / "checkpoints" / "step_000002").is_dir(), sorted(p.name for p in (run_dir / "checkpoints").iterdir())
