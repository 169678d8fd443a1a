"""What every chaos case shares: a tiny run with varied rewards, checkpoints and
``cluster.max_resumes``; finishing it (directly, or by ``afctl up --resume`` when it
stopped cleanly); the exactly-once audit; and the check that no process is left.

Random moments come from a seeded ``random.Random``: the seed is in the test id, and
``AF_CHAOS_SEED`` shifts every seed (``AF_CHAOS_SEED=7 python -m pytest -m chaos
tests/chaos``) to explore other moments. Every failure message starts with the seed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from wf_helpers import afctl, assert_trained_exactly_once, child_hosts, write_config

HERE = Path(__file__).resolve().parent
HOOKS = HERE / "hooks"
NUM_STEPS, CHECKPOINT_EVERY, PROMPTS_PER_STEP, GROUP_SIZE = 6, 2, 2, 2
SEED_SHIFT = int(os.environ.get("AF_CHAOS_SEED", "0"))
HOSTS_FOLLOW_S = 40.0  # a host's stop grace (core/host.py STOP_GRACE_S) and some
ORPHANS_FOLLOW_S = 20.0  # an orphan's grace (core/host.py ORPHAN_GRACE_S, 10 s) and some: hosts took 30 s before
LIVE: list[ChaosRun] = []  # killed by the autouse fixture of conftest.py after each test, whatever happened


def rng_for(seed: int) -> random.Random:
    return random.Random(seed + SEED_SHIFT)


@dataclass
class ChaosRun:
    """One ``afctl up`` of the tiny config, watched: every host pid it ever had is kept."""

    tmp_path: Path
    seed: int
    num_steps: int = NUM_STEPS
    extra_cluster: str = ""
    changes: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    new_session: bool = False  # the driver leads its own process group (which a test may stop as a whole)
    config_text: str = ""  # a whole run config of the test's own instead of the tiny one ("" : the tiny config)
    prompts_per_step: int = PROMPTS_PER_STEP  # the audit's batch shape (that of config_text when given)
    group_size: int = GROUP_SIZE
    proc: subprocess.Popen | None = None
    pids: set = field(default_factory=set)
    outputs: list = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.tmp_path / "run"

    @property
    def marks(self) -> Path:
        return self.tmp_path / "marks"

    def why(self, text: str = "") -> str:
        return f"seed {self.seed + SEED_SHIFT} (AF_CHAOS_SEED={SEED_SHIFT}): {text}"

    def start(self) -> ChaosRun:
        self.marks.mkdir(exist_ok=True)
        if self.config_text:
            config = self.tmp_path / "chaos.toml"
            config.write_text(self.config_text)
        else:
            changes = {"reward": {"functions": ["chaos_rewards:switchable"]}, **self.changes}
            config = write_config(
                self.tmp_path,
                num_steps=self.num_steps,
                checkpoint_every=CHECKPOINT_EVERY,
                changes=changes,
                extra=f'[cluster]\npython_path = ["{HERE}"]\nmax_resumes = 2\nrestart_backoff_s = 0.2\n{self.extra_cluster}',
            )
        self.proc = self._afctl("up", str(config), "--run-dir", str(self.run_dir))
        LIVE.append(self)
        return self

    def kill_everything(self) -> None:
        """kill -9 the driver and every host it ever had (a test that failed or timed out)."""
        if self.proc is not None and self.proc.poll() is None:
            self.pids.update(child_hosts(self.proc.pid).values())
            self.proc.kill()
            self.proc.wait(timeout=10)
        for pid in self.pids:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _afctl(self, *args: str) -> subprocess.Popen:
        path = os.pathsep.join(p for p in (str(HOOKS), os.environ.get("PYTHONPATH", "")) if p)
        env = {"PYTHONPATH": path, "AF_CHAOS_MARKS": str(self.marks), **self.env}
        proc = afctl(*args, env_extra=env, start_new_session=self.new_session)
        threading.Thread(target=self._watch, args=(proc,), daemon=True).start()
        return proc

    def _watch(self, proc: subprocess.Popen) -> None:
        """Keep every host pid of this driver, so that the end can check each one is gone."""
        while proc.poll() is None:
            self.pids.update(child_hosts(proc.pid).values())
            time.sleep(0.2)

    def hosts(self) -> dict[str, int]:
        hosts = child_hosts(self.proc.pid)
        self.pids.update(hosts.values())
        return hosts

    def steps_done(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        return len([line for line in path.read_text().splitlines() if line.strip()]) if path.exists() else 0

    def wait_until(self, what: str, predicate, timeout_s: float = 150.0):
        """Poll ``predicate`` (files the run writes, /proc) until it gives something true."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.proc.poll() is not None:
                raise AssertionError(
                    self.why(f"the run exited ({self.proc.returncode}) before {what}:\n{self.proc.stdout.read()}")
                )
            time.sleep(0.02)
        raise AssertionError(self.why(f"no {what} within {timeout_s} s"))

    def wait_for_step(self, step: int) -> None:
        self.wait_until(f"{step} steps", lambda: self.steps_done() >= step)

    def kill(self, host: str, old_pid: int | None = None) -> int:
        """kill -9 the process ``host`` (a newer one than ``old_pid`` when given); returns its pid."""
        pid = self.wait_until(f"a process {host}", lambda: (p := self.hosts().get(host)) and p != old_pid and p)
        os.kill(pid, signal.SIGKILL)
        return pid

    def freeze(self, host: str) -> int:
        """SIGSTOP the process ``host`` (it stays until ``thaw``); returns its pid."""
        pid = self.wait_until(f"a process {host}", lambda: self.hosts().get(host))
        os.kill(pid, signal.SIGSTOP)
        return pid

    def freeze_everything(self) -> None:
        """SIGSTOP the driver's whole process group, the driver with its hosts (Ctrl-Z of ``afctl up``)."""
        assert self.new_session, "start the run with new_session=True: the group is the driver's own"
        self.hosts()
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def thaw(self, pid: int | None = None) -> None:
        """SIGCONT the process ``pid``, or the driver's whole process group."""
        if pid is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
        else:
            os.kill(pid, signal.SIGCONT)

    def finish_without_failure(self, timeout_s: float = 240.0) -> str:
        """Wait for the run's end: it must complete by itself (exit code 0) with no role or
        process failing on the way (no failure printed, no automatic resume), every
        group trained exactly once, no process left."""
        out, _ = self.proc.communicate(timeout=timeout_s)
        self.outputs.append(out)
        self.assert_nothing_left()
        assert self.proc.returncode == 0, self.why(f"exit code {self.proc.returncode}:\n{out}")
        for bad in ("run failed", "automatic resume", "Traceback (most recent call last)", "exited with code"):
            assert bad not in out, self.why(f"the run printed {bad!r}:\n{out}")
        assert f"done: {self.num_steps} steps" in out, self.why(out)
        try:
            assert_trained_exactly_once(self.run_dir, self.num_steps, self.prompts_per_step, self.group_size)
        except AssertionError as exc:
            raise AssertionError(self.why(f"audit: {exc}\n{out}")) from exc
        return out

    def kill_driver(self) -> None:
        """kill -9 the driver (``afctl up``) itself: its hosts must follow it (they get
        SIGTERM when their parent dies) within ``ORPHANS_FOLLOW_S``."""
        self.hosts()
        self.proc.kill()
        self.proc.wait(timeout=10)
        deadline = time.monotonic() + ORPHANS_FOLLOW_S
        while time.monotonic() < deadline and any(_alive(pid) for pid in self.pids):
            time.sleep(0.1)
        alive = [pid for pid in self.pids if _alive(pid)]
        assert not alive, self.why(f"hosts {alive} outlived their killed driver by {ORPHANS_FOLLOW_S:g} s (ORPHAN_GRACE_S: 10)")

    def finish(self, timeout_s: float = 240.0, expect_stop: str | None = None) -> str:
        """Wait for the run's end. A clean stop (exit code 1, no traceback), or a driver
        this test killed (-9), is resumed with ``afctl up --resume RUN_DIR``;
        ``expect_stop``: text the stop must print."""
        out, _ = self.proc.communicate(timeout=timeout_s)
        self.outputs.append(out)
        self.assert_nothing_left()
        assert "Traceback (most recent call last)" not in out, self.why(f"the driver printed a traceback:\n{out}")
        if expect_stop is not None:
            assert self.proc.returncode == 1, self.why(f"expected a clean stop, got {self.proc.returncode}:\n{out}")
            assert expect_stop in out, self.why(f"the stop does not say {expect_stop!r}:\n{out}")
        if self.proc.returncode != 0:
            clean = self.proc.returncode == 1 and "run failed" in out
            assert clean or self.proc.returncode == -9, self.why(f"not a clean stop:\n{out}")
            self.before_resume()
            self.proc = self._afctl("up", "--resume", str(self.run_dir))
            out, _ = self.proc.communicate(timeout=timeout_s)
            self.outputs.append(out)
            self.assert_nothing_left()
            assert self.proc.returncode == 0, self.why(f"the resume did not complete:\n{out}")
        assert f"done: {self.num_steps} steps" in out, self.why(out)
        try:
            assert_trained_exactly_once(self.run_dir, self.num_steps, self.prompts_per_step, self.group_size)
        except AssertionError as exc:
            raise AssertionError(self.why(f"audit: {exc}\n" + "\n----\n".join(self.outputs))) from exc
        return "\n".join(self.outputs)

    def before_resume(self) -> None:
        """What a test fixes before ``--resume`` (a flag file it removes)."""

    def assert_nothing_left(self) -> None:
        """No host of the driver (it has exited: every host pid seen must be gone or a
        zombie), and no process whose command line names the run dir or its ipc dir."""
        self.pids.update(child_hosts(self.proc.pid).values())
        alive = [pid for pid in self.pids if _alive(pid)]
        names = [str(self.run_dir)] + _ipc_dirs(self.run_dir)
        strays = [pid for pid in _all_pids() if pid != os.getpid() and _alive(pid) and any(n in _cmdline(pid) for n in names)]
        assert not alive and not strays, self.why(
            f"left behind: hosts {alive}, others {strays} ({[_cmdline(p) for p in alive + strays]})"
        )


def _ipc_dirs(run_dir: Path) -> list[str]:
    try:
        transport = json.loads((run_dir / "cluster.json").read_text())["transport"]
    except (OSError, ValueError, KeyError):
        return []
    return [transport["ipc_dir"]] if transport.get("ipc_dir") else []


def _all_pids() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
