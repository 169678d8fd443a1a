"""What ``afctl up`` prints and leaves behind."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from wf_helpers import afctl, write_config


@pytest.mark.timeout(200)
def test_afctl_up_prints_no_progress_bars_says_what_starts_and_leaves_no_temporary_directory(tmp_path, request):
    tmp = Path(tempfile.mkdtemp(prefix="afq-", dir="/tmp"))  # short: ipc socket paths are limited to ~100 bytes
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    proc = afctl(
        "up", str(write_config(tmp_path, num_steps=2)), "--run-dir", str(tmp_path / "run"), env_extra={"TMPDIR": str(tmp)}
    )
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert "Loading weights" not in out and "Writing model shards" not in out, out
    assert "starting 6 processes: queue, shard.0, loader, rollout.0, reward.0, trainer" in out, out
    assert "waiting for the first step" in out, out
    assert [p.name for p in tmp.iterdir() if p.name.startswith("af-")] == []  # the ipc directory is removed
