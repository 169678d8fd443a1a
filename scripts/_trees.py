"""An older revision of this repository as a plain directory, for the before/after scripts that run
one measurement against two trees (``PYTHONPATH=<tree> python -P ...``)."""

from __future__ import annotations

import subprocess
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
