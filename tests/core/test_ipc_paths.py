"""ipc addresses fit a Unix socket's path (107 bytes): a long ipc directory, such as a test's
temporary directory under a parallel runner, still binds, and one too long is named with the fix."""

from __future__ import annotations

import pytest

from asyncflow.core.transport import IPC_PATH_MAX, TransportConfig, listen, new_address


def _deep_private_dir(root, length: int) -> str:
    """A private directory whose path is ``length`` bytes long."""
    path = root / ("d" * max(1, length - len(str(root)) - 1))
    path.mkdir(mode=0o700)
    assert len(str(path)) == length
    return str(path)


@pytest.mark.timeout(30)
def test_an_actor_with_a_long_name_in_a_long_ipc_directory_still_gets_an_address_that_binds(tmp_path):
    # 80 bytes of directory: "/tq.controller.reference-<pid>-<n>.sock" would pass the limit
    folder = _deep_private_dir(tmp_path, 80)
    config = TransportConfig(scheme="ipc", ipc_dir=folder)
    address = new_address(config, "tq.controller.reference")
    assert address.startswith(f"ipc://{folder}/") and len(address.removeprefix("ipc://").encode()) <= IPC_PATH_MAX
    sock, bound = listen(address, config)
    try:
        assert bound == address
    finally:
        sock.close()
    # a short directory keeps the actor's name in the file name (what a person reads in the directory)
    assert "echo" in new_address(TransportConfig(scheme="ipc", ipc_dir=str(tmp_path)), "echo")


@pytest.mark.timeout(30)
def test_an_ipc_directory_too_long_for_any_socket_is_refused_naming_the_key_and_the_fix(tmp_path):
    folder = _deep_private_dir(tmp_path, IPC_PATH_MAX - 5)
    with pytest.raises(ValueError, match=r"\[cluster.transport\] ipc_dir .* too long .* 107 bytes.*shorter directory"):
        new_address(TransportConfig(scheme="ipc", ipc_dir=folder), "echo")
