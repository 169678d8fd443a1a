"""The checkpoint directories of a run (``RUN_DIR/checkpoints/step_N``) and the link to
the newest one: torch-free, so the driver and ``afctl`` find checkpoints without
importing the trainer. A checkpoint is complete once its ``DONE`` file (holding its
step) exists; ``MANIFEST.json`` (``trainer/manifest.py``) says whether it is intact.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path


def checkpoint_dir(run_dir: str | Path, version: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{version:06d}"


def done_step(path: Path) -> int | None:
    """The step a complete checkpoint's ``DONE`` file holds; None when it holds no number."""
    try:
        return int((path / "DONE").read_text().strip())
    except (OSError, ValueError):
        return None


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    done = sorted(p for p in (Path(run_dir) / "checkpoints").glob("step_*") if (p / "DONE").exists())
    return done[-1] if done else None


def latest_good_checkpoint(run_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete checkpoint whose MANIFEST.json verifies, and the newer ones
    skipped as damaged, each with what is wrong (naming the file)."""
    from asyncflow.actors.trainer.manifest import damage

    skipped: list[tuple[Path, str]] = []
    for path in sorted((p for p in (Path(run_dir) / "checkpoints").glob("step_*") if (p / "DONE").exists()), reverse=True):
        wrong = damage(path) if done_step(path) is not None else "DONE: not a step number"
        if wrong is None:
            return path, skipped
        skipped.append((path, wrong))
    return None, skipped


LATEST = "latest"
"""``checkpoints/latest``: a relative link to the newest complete checkpoint's Hugging
Face model directory (``step_N/model``), what ``from_pretrained`` and ``model.path`` load."""


def link_latest(final: Path) -> Path | None:
    """Point ``checkpoints/latest`` at ``final``'s model. A ``latest`` that is a real
    directory (a run directory copied with its links followed) is moved aside to
    ``latest.copy-<time>``, never deleted; returns where, else None."""
    link, tmp = final.parent / LATEST, final.parent / f".{LATEST}.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    aside = None
    if link.is_dir() and not link.is_symlink():
        aside = link.with_name(f"{LATEST}.copy-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(link, aside)
    os.symlink(f"{final.name}/model", tmp)
    os.replace(tmp, link)  # atomic: a reader sees the old link or the new one
    return aside


def prune_checkpoints(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete the complete checkpoints older than the newest ``keep`` (0: none), never
    the one ``latest`` points to, and every unfinished ``step_*.tmp`` but the newest
    step's; returns the deleted directories. The best (``best_*``) is not touched."""
    if keep <= 0:
        return []
    root = Path(run_dir) / "checkpoints"
    complete = sorted(p for p in root.glob("step_*") if not p.name.endswith(".tmp") and (p / "DONE").exists())
    latest = (root / LATEST).resolve().parent if (root / LATEST).is_symlink() else None
    doomed = [p for p in complete[:-keep] if p.resolve() != latest]
    for path in doomed:
        shutil.rmtree(path)
    return doomed
