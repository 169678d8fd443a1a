"""``transport.sweep_ipc_dir``: what an orphaned host does to its killed driver's ipc
directory as it exits. Sockets of gone processes go; a running process's socket, or a file
that is not a socket of ours, keeps the directory; the last one out removes it."""

from __future__ import annotations

import os
import subprocess
import sys

import pynng
import pytest

from asyncflow.core.transport import TransportConfig, sweep_ipc_dir


def _gone_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _socket_file(path: str) -> None:
    """A socket file left behind, as by a process killed with kill -9 (nng removes its own on close)."""
    import socket

    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    sock.close()  # a bound unix socket's file stays after close


@pytest.mark.timeout(20)
def test_the_last_one_out_removes_the_directory_and_a_live_socket_keeps_it_until_then(tmp_path):
    folder = tmp_path / "af"
    folder.mkdir(mode=0o700)
    config = TransportConfig(scheme="ipc", ipc_dir=str(folder))
    dead, driver = _gone_pid(), 999_999_999
    _socket_file(str(folder / f"collector-{dead}-1.sock"))
    _socket_file(str(folder / f"directory-{driver}-0.sock"))
    live = pynng.Rep0(listen=f"ipc://{folder}/rollout.0-{os.getpid()}-3.sock")
    try:
        assert not sweep_ipc_dir(config, gone={driver})  # this process still listens
        assert sorted(p.name for p in folder.iterdir()) == [f"rollout.0-{os.getpid()}-3.sock"]
    finally:
        live.close()
    assert sweep_ipc_dir(config) and not folder.exists()
    assert sweep_ipc_dir(config)  # already gone: another host was last


@pytest.mark.timeout(20)
def test_a_file_of_someone_else_keeps_the_directory_and_the_default_directory_is_never_swept(tmp_path):
    folder = tmp_path / "af"
    folder.mkdir(mode=0o700)
    (folder / "notes.txt").write_text("not ours")
    _socket_file(str(folder / f"x-{_gone_pid()}-0.sock"))
    assert not sweep_ipc_dir(TransportConfig(scheme="ipc", ipc_dir=str(folder)))
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    assert not sweep_ipc_dir(TransportConfig(scheme="ipc"))  # TMPDIR/asyncflow-UID is shared: left alone
    assert not sweep_ipc_dir(TransportConfig(scheme="tcp", ipc_dir=str(folder)))
