"""Checkpoint directories (actors/trainer/checkpoints.py): which are kept, and the ``latest`` link."""

from __future__ import annotations

import os

import pytest

from asyncflow.actors.trainer.checkpoints import checkpoint_dir, latest_checkpoint, link_latest, prune_checkpoints

pytestmark = pytest.mark.timeout(10)


def make(run_dir, step: int, done: bool = True):
    path = checkpoint_dir(run_dir, step)
    (path / "model").mkdir(parents=True)
    if done:
        (path / "DONE").write_text(f"{step}\n")
    return path


def test_keep_checkpoints_deletes_the_older_complete_ones_never_the_latest_nor_the_best(tmp_path):
    for step in (2, 4, 6, 8):
        make(tmp_path, step)
    unfinished = make(tmp_path, 10, done=False)  # being written: not complete, not counted, not deleted
    best = tmp_path / "checkpoints" / "best_000003"
    best.mkdir()
    link_latest(checkpoint_dir(tmp_path, 8))
    assert prune_checkpoints(tmp_path, 0) == []  # 0: keep every one
    deleted = prune_checkpoints(tmp_path, 2)
    assert [p.name for p in deleted] == ["step_000002", "step_000004"]
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == ["best_000003", "latest", "step_000006", "step_000008", "step_000010"], left
    assert unfinished.exists() and latest_checkpoint(tmp_path).name == "step_000008"


def test_the_checkpoint_latest_points_to_is_kept_even_when_newer_ones_exist(tmp_path):
    for step in (2, 4, 6):
        make(tmp_path, step)
    link_latest(checkpoint_dir(tmp_path, 2))  # e.g. a resume from step 2 that has not saved yet
    assert [p.name for p in prune_checkpoints(tmp_path, 1)] == ["step_000004"]


def test_a_latest_that_is_a_copied_directory_is_moved_aside_not_lost_and_becomes_a_link(tmp_path):
    make(tmp_path, 2)
    copied = tmp_path / "checkpoints" / "latest"
    copied.mkdir()
    (copied / "model.safetensors").write_bytes(b"weights")  # cp -rL of a run directory
    aside = link_latest(checkpoint_dir(tmp_path, 2))
    assert aside is not None and (aside / "model.safetensors").read_bytes() == b"weights"
    assert copied.is_symlink() and os.readlink(copied) == "step_000002/model"
    assert link_latest(checkpoint_dir(tmp_path, 2)) is None  # a link is simply replaced
