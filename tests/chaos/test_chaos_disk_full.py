"""A disk that is full during a checkpoint, for real: the run directory is a small tmpfs
of its own. Once the first checkpoint is saved the filesystem is shrunk to what the run
uses and half a checkpoint more, so a later checkpoint fills it. The run stops cleanly,
saying "no space left on device" with the path, the free space and the fix, without a
traceback or a ``--- Logging error ---`` block; once space is back (the filesystem grown
again) ``afctl up --resume`` completes, every group trained exactly once, no process left.

Mounting needs root: the test is skipped, saying why, where it is not root or the mount
fails."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from chaos_helpers import NUM_STEPS, ChaosRun, rng_for

pytestmark = pytest.mark.chaos

ROOMY = 64 << 20  # bytes: the run's filesystem before and after the full disk
PAGE = 4096


def _mount(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def small_disk(tmp_path):
    """RUN_DIR (tmp_path/run) on a tmpfs of ``ROOMY`` bytes, unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs of its own: mounting one needs root")
    where = tmp_path / "run"
    where.mkdir()
    done = _mount(["-t", "tmpfs", "-o", f"size={ROOMY},mode=0700", "tmpfs", str(where)])
    if done.returncode != 0:
        pytest.skip(f"mount -t tmpfs failed ({done.stderr.strip() or done.returncode}): no small filesystem to fill")
    yield where
    if subprocess.run(["umount", str(where)], capture_output=True, timeout=30).returncode != 0:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)  # a straggler holds it: detach


def _resize(where: Path, size_bytes: int) -> None:
    done = _mount(["-o", f"remount,size={size_bytes}", str(where)])
    assert done.returncode == 0, f"mount -o remount,size={size_bytes} {where}: {done.stderr}"


def _used_bytes(where: Path) -> int:
    st = os.statvfs(where)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [500])
def test_a_full_disk_during_a_checkpoint_stops_the_run_cleanly_and_resume_completes_it(tmp_path, small_disk, seed):
    run = ChaosRun(tmp_path, seed, env={"AF_CHAOS_HOLD_S": "0"})  # the hooks hold nothing: no mark is awaited
    run.before_resume = lambda: _resize(small_disk, ROOMY)  # space is back
    run.start()
    run.wait_for_step(rng_for(seed).randint(3, NUM_STEPS - 2))  # step_000002 is saved; a later save fills the disk
    checkpoint = _tree_bytes(run.run_dir / "checkpoints" / "step_000002")
    full_at = -(-(_used_bytes(small_disk) + checkpoint // 2) // PAGE) * PAGE
    _resize(small_disk, full_at)
    out = run.finish(expect_stop="no space left on device: ")
    assert f"{small_disk}/checkpoints/step_" in out, run.why(f"the stop does not name the checkpoint's path:\n{out}")
    assert "--- Logging error ---" not in out, run.why(f"a log handler printed its traceback:\n{out}")
    assert "unexpected pos" not in out, run.why(f"torch's write error, not the full disk, is what the stop says:\n{out}")
