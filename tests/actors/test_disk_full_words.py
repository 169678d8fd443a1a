"""A full disk named as such: a process's log file on a full device says so once, in one
line, never logging's ``--- Logging error ---`` block; a failed write is called a full disk
by its errno, or (torch's RuntimeError) by the filesystem's free space."""

from __future__ import annotations

import errno
import logging
import os

import pytest

from asyncflow.core.disk_space import no_space_left
from asyncflow.core.host import _LogFile


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full (a device whose every write is ENOSPC)")
def test_a_log_file_on_a_full_device_says_so_once_without_tracebacks(capsys):
    handler = _LogFile("/dev/full")
    logger = logging.getLogger("test_disk_full_words")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        for k in range(3):
            logger.error("record %d", k)
    finally:
        logger.removeHandler(handler)
        handler.close()
    err = capsys.readouterr().err
    assert "--- Logging error ---" not in err and "Traceback" not in err, err
    assert err.count("\n") == 1, err
    assert "log file /dev/full: a record could not be written (no space left on device: /dev/full" in err, err


def test_enospc_is_a_full_disk_and_a_runtime_error_with_room_to_spare_is_not(tmp_path):
    full = no_space_left(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "a.bin")), tmp_path)
    assert full is not None and full.startswith(f"no space left on device: {tmp_path / 'a.bin'} (") and " free)" in full
    assert no_space_left(RuntimeError("unexpected pos 160576 vs 160468"), tmp_path) is None  # this disk has room
    assert no_space_left(OSError(errno.EACCES, "Permission denied"), tmp_path) is None
    assert no_space_left(ValueError("not a write"), tmp_path) is None
