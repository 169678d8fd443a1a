"""Where a running cluster can be found: ``RUN_DIR/cluster.json`` and a pointer file.

The driver writes ``RUN_DIR/cluster.json`` once the directory actor serves (its
address and the transport, never the secret), and points
``$TMPDIR/asyncflow-current-<uid>.json`` at the run directory, so ``afctl status``
without an argument finds the latest run started on this machine. At a clean stop
the driver marks cluster.json ``running = false`` and removes the pointer if it
still points at its own run.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import msgspec

from asyncflow.core.transport import TransportConfig

CLUSTER_FILE = "cluster.json"


class ClusterFile(msgspec.Struct, kw_only=True):
    run_dir: str
    directory: str  # the directory actor's address
    transport: TransportConfig  # secret always empty: from ASYNCFLOW_SECRET, or RUN_DIR/secret (read)
    driver_pid: int
    started_at: float  # wall clock, seconds
    hosts: dict[str, int] = {}  # process host name -> pid
    workers: list[str] = []  # worker roles, in launch order
    tasks: list[str] = []  # queue tasks
    running: bool = True


def pointer_path() -> Path:
    return Path(tempfile.gettempdir()) / f"asyncflow-current-{os.getuid()}.json"


def write(info: ClusterFile) -> None:
    """Write RUN_DIR/cluster.json (atomically) and point the pointer file at it."""
    info = msgspec.structs.replace(info, transport=msgspec.structs.replace(info.transport, secret=""))
    _write_atomic(Path(info.run_dir) / CLUSTER_FILE, msgspec.json.format(msgspec.json.encode(info)))
    _write_atomic(pointer_path(), msgspec.json.encode({"run_dir": os.path.abspath(info.run_dir), "at": time.time()}))


def mark_stopped(run_dir: str | os.PathLike) -> None:
    path = Path(run_dir) / CLUSTER_FILE
    if path.exists():
        info = msgspec.json.decode(path.read_bytes(), type=ClusterFile)
        _write_atomic(path, msgspec.json.format(msgspec.json.encode(msgspec.structs.replace(info, running=False))))
    pointer = pointer_path()
    try:
        if msgspec.json.decode(pointer.read_bytes())["run_dir"] == os.path.abspath(run_dir):
            pointer.unlink()
    except (FileNotFoundError, msgspec.DecodeError, KeyError):
        pass  # another run took the pointer over, or it is gone: leave it


def read(run_dir: str | os.PathLike | None) -> ClusterFile:
    """The cluster of ``run_dir``, or of the latest run started here when None."""
    if run_dir is None:
        pointer = pointer_path()
        if not pointer.exists():
            raise FileNotFoundError(
                f"no running cluster found ({pointer} does not exist): start one with `afctl up CONFIG` "
                f"or pass its run directory: `afctl status RUN_DIR`"
            )
        run_dir = _follow(pointer)
    path = Path(run_dir) / CLUSTER_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: {run_dir} is not the run directory of a started cluster")
    info = msgspec.json.decode(path.read_bytes(), type=ClusterFile)
    secret_file = Path(run_dir) / "secret"  # the run's own secret (0600: readable by its user only)
    if not info.transport.secret_bytes() and os.access(secret_file, os.R_OK):
        info = msgspec.structs.replace(info, transport=msgspec.structs.replace(info.transport, secret=secret_file.read_text()))
    return info


def _follow(pointer: Path) -> str:
    """The run directory the pointer names, if the pointer is a plain file of this
    user: it lives in the shared temp directory, where another user may have planted
    one under this user's name (or a link to one of theirs)."""
    again = "pass the run directory instead: `afctl status RUN_DIR`"
    st = pointer.lstat()
    if pointer.is_symlink():
        raise FileNotFoundError(f"{pointer} is a link, not the file `afctl up` writes: not followed; {again}")
    if st.st_uid != os.getuid():
        raise FileNotFoundError(f"{pointer} is owned by uid {st.st_uid}, not by you: not followed; {again}")
    try:
        return str(msgspec.json.decode(pointer.read_bytes())["run_dir"])
    except (msgspec.DecodeError, KeyError, TypeError):
        raise FileNotFoundError(f"{pointer} is not a pointer `afctl up` wrote; {again}") from None


def driver_alive(info: ClusterFile) -> bool:
    try:
        os.kill(info.driver_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    try:
        os.replace(tmp, path)  # a file of ours: a planted one is replaced, a link is not followed
    except PermissionError:  # the sticky temp directory keeps another user's file: no pointer this time
        tmp.unlink(missing_ok=True)
        if path.parent != Path(tempfile.gettempdir()):
            raise
