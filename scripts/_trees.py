"""An older revision of this repository as a plain directory, for the before/after scripts that run
one measurement against two trees (``PYTHONPATH=<tree> python -P ...``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tree_at(rev: str, dest: Path) -> Path:
    """``rev``'s files extracted into ``dest`` (kept: a second call reuses them); returns ``dest``, resolved."""
    dest = dest.resolve()
    if not (dest / "asyncflow").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, stdout=subprocess.PIPE, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def run_against(tree: Path, script: Path, args: list[str]) -> str:
    """``script`` (a file of this tree) run with ``tree`` alone on the import path (``python -P``, one
    torch thread); its output (stdout and stderr). A failure stops the caller with the output's tail."""
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-P", str(script), *args]
    done = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {script.name} failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return done.stdout
