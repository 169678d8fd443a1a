"""Small end-to-end runs for the observability tests."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from tiny_config import write_tiny_config

HERE = Path(__file__).parent


def write_config(
    path: Path,
    *,
    mode: str = "async",
    num_steps: int = 4,
    staleness: int = 1,
    reward: str = "asyncflow.toy.tasks:reward",
    hang_timeout_s: float = 300,
) -> Path:
    """examples/tiny.toml with these settings (tests/tiny_config.py)."""
    return write_tiny_config(
        path,
        {
            "reward": {"functions": [reward]},
            "train": {"num_steps": num_steps},
            "workflow": {"mode": mode, "staleness": staleness},
            "logging": {"hang_timeout_s": hang_timeout_s},
        },
    )


def env(**extra: str) -> dict[str, str]:
    out = dict(os.environ, OMP_NUM_THREADS="1")
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))
    out.update(extra)
    return out


def afctl(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from asyncflow.cli.main import main; main()", *args],
        env=env(**extra_env),
        capture_output=True,
        text=True,
        timeout=120,
    )


class Run:
    """`afctl up` in the background; its output (stdout and stderr together) is collected
    line by line so a test can wait for a line to appear."""

    def __init__(self, config: Path, run_dir: Path, **extra_env: str):
        self.run_dir = run_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from asyncflow.cli.main import main; main()", "up", str(config), "--run-dir", str(run_dir)],
            env=env(**extra_env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, text: str, timeout_s: float) -> None:
        with self._changed:
            ok = self._changed.wait_for(
                lambda: any(text in line for line in self.lines) or self.proc.poll() is not None, timeout=timeout_s
            )
        if not ok or not any(text in line for line in self.lines):
            raise AssertionError(f"no line with {text!r} within {timeout_s} s (exit code {self.proc.poll()}):\n{self.output}")

    def finish(self, timeout_s: float) -> int:
        code = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
