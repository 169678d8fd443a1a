"""Small end-to-end runs: a tiny model without warm start, a few steps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tiny_config import write_tiny_config


def write_config(
    tmp_path: Path,
    mode: str = "async",
    num_steps: int = 4,
    staleness: int = 1,
    checkpoint_every: int = 0,
    extra: str = "",
    changes: dict | None = None,
) -> Path:
    """examples/tiny.toml with these settings (``changes``: more keys, see tests/tiny_config.py)."""
    base = {
        "train": {"num_steps": num_steps, "checkpoint_every": checkpoint_every},
        "workflow": {"mode": mode, "staleness": staleness},
    }
    for table, values in (changes or {}).items():
        base.setdefault(table, {}).update(values)
    return write_tiny_config(tmp_path / f"{mode}.toml", base, textwrap.dedent(extra))


def wait_for_steps(run_dir: Path, proc, num_steps: int, timeout_s: float) -> None:
    """Block until metrics.jsonl has ``num_steps`` lines (polling a file the run appends to)."""
    deadline = time.monotonic() + timeout_s
    path = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if path.exists() and len(read_jsonl(path)) >= num_steps:
            return
        if proc.poll() is not None:
            raise AssertionError(f"afctl up exited early ({proc.returncode}):\n{proc.stdout.read()}")
        time.sleep(0.1)
    raise AssertionError(f"no {num_steps} steps within {timeout_s} s")


def _like_a_terminal_job() -> None:
    """SIGINT at its default in the child, as in a job a terminal's Ctrl-C reaches. A non-interactive
    shell starts a background command (``.ci/run &``) with SIGINT ignored, everything under it inherits
    that, and Python leaves an inherited ignored SIGINT ignored: the driver would never see the test's
    Ctrl-C and would run on (it did: a 100,000-step run trained until SIGTERM)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def afctl(*args: str, env_extra: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """``afctl ARGS`` in a child process, its output read at the end. With ``start_new_session`` (a test
    that stops the run with Ctrl-C: ``os.killpg(pid, SIGINT)``) its SIGINT is at the default, whatever
    the test's own (``_like_a_terminal_job``)."""
    if kwargs.get("start_new_session"):
        kwargs.setdefault("preexec_fn", _like_a_terminal_job)
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    return subprocess.Popen(
        [sys.executable, "-m", "asyncflow.cli.main", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def child_hosts(parent_pid: int) -> dict[str, int]:
    """The process hosts started by ``parent_pid`` (a driver) -> {host name: pid}."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if ppid == parent_pid and "asyncflow.core.host" in args:
            out[args[args.index("--name") + 1]] = int(entry.name)
    return out


def assert_trained_exactly_once(run_dir: Path, num_steps: int, prompts_per_step: int, group_size: int) -> None:
    """Every planned prompt group of every step was trained once, with all its rows, and nothing else."""
    lines = read_jsonl(run_dir / "trained.jsonl")
    assert [rec["step"] for rec in lines] == list(range(num_steps))
    groups = [g for rec in lines for g in rec["groups"]]
    indices = [i for rec in lines for i in rec["indices"]]
    assert len(indices) == len(set(indices)) == num_steps * prompts_per_step * group_size
    counts = {g: groups.count(g) for g in set(groups)}
    assert set(counts.values()) == {group_size}
    assert len(counts) == num_steps * prompts_per_step
