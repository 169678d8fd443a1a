"""The checkpoint directories of a run (``RUN_DIR/checkpoints/step_N``) and the link to
the newest one: torch-free, so the driver and ``afctl`` find checkpoints without
importing the trainer. A checkpoint is complete once its ``DONE`` file (holding its
step) exists; ``MANIFEST.json`` (``_manifest.py``) says whether it is intact.
"""

from __future__ import annotations

import os
from pathlib import Path


def checkpoint_dir(run_dir: str | Path, version: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{version:06d}"


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    done = sorted(p for p in (Path(run_dir) / "checkpoints").glob("step_*") if (p / "DONE").exists())
    return done[-1] if done else None


def latest_good_checkpoint(run_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete checkpoint whose MANIFEST.json verifies, and the newer ones
    skipped as damaged, each with what is wrong (naming the file)."""
    from asyncflow.actors._manifest import damage

    skipped: list[tuple[Path, str]] = []
    for path in sorted((p for p in (Path(run_dir) / "checkpoints").glob("step_*") if (p / "DONE").exists()), reverse=True):
        wrong = damage(path)
        if wrong is None:
            return path, skipped
        skipped.append((path, wrong))
    return None, skipped


LATEST = "latest"
"""``checkpoints/latest``: a relative link to the newest complete checkpoint's Hugging
Face model directory (``step_N/model``), what ``from_pretrained`` and ``model.path`` load."""


def _link_latest(final: Path) -> None:
    link, tmp = final.parent / LATEST, final.parent / f".{LATEST}.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(f"{final.name}/model", tmp)
    os.replace(tmp, link)  # atomic: a reader sees the old link or the new one
