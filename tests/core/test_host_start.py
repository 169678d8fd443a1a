"""Starting a process host that dies: the driver learns it at once, with the exit code
(a death before the registration used to cost a 120 s wait)."""

from __future__ import annotations

import os
import time

import pytest

from asyncflow.core import protocol
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.errors import AsyncflowError, HostExited
from asyncflow.core.host import spawn_host
from asyncflow.core.transport import TransportConfig


@pytest.fixture
def directory(tmp_path):
    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path / "ipc"))
    served = start_directory(transport)
    yield DirectoryClient(served.address, transport), transport
    served.stop()


def _env_with(path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH", "")]))}


@pytest.mark.timeout(30)
def test_a_host_that_exits_before_it_registers_fails_its_start_at_once_with_its_exit_code(directory, tmp_path):
    dc, transport = directory
    (tmp_path / "sitecustomize.py").write_text("import os\nos._exit(7)\n")  # runs before the host's main
    spec = protocol.ActorSpec(name="echo", cls="asyncflow.core.echo:EchoActor")
    t0 = time.monotonic()
    with pytest.raises(HostExited, match="'early' exited with code 7 before it registered"):
        spawn_host("early", dc, transport, [spec], env=_env_with(tmp_path), timeout_s=120)
    assert time.monotonic() - t0 < 15


@pytest.mark.timeout(60)
def test_a_host_that_dies_while_it_starts_its_actors_fails_with_its_exit_code(directory, tmp_path):
    dc, transport = directory
    (tmp_path / "dies_on_import.py").write_text("import os\nos._exit(5)\n")
    spec = protocol.ActorSpec(name="doomed", cls="dies_on_import:Actor")
    with pytest.raises(HostExited, match="'doomed' exited with code 5 while it started its actors"):
        spawn_host("doomed", dc, transport, [spec], env=_env_with(tmp_path))


_FAILING_ACTORS = """
from asyncflow.core import protocol
from asyncflow.core.echo import EchoActor


def pick_position(positions):
    return positions[len(positions)]  # the IndexError a real replica hit while it started


class FailsInInit(EchoActor):
    Inbox = protocol.EchoIn

    def __init__(self, ctx):
        super().__init__(ctx)
        pick_position([1, 2, 3])


class FailsInOnStart(EchoActor):
    Inbox = protocol.EchoIn

    def on_start(self):
        pick_position([1, 2, 3])
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cls", ["FailsInInit", "FailsInOnStart"])
def test_an_actor_that_raises_while_its_process_starts_it_leaves_its_whole_traceback_in_the_process_log(directory, tmp_path, cls):
    dc, transport = directory
    (tmp_path / "start_fails.py").write_text(_FAILING_ACTORS)
    logs = tmp_path / "logs"
    env = {**_env_with(tmp_path), "ASYNCFLOW_LOG_DIR": str(logs)}
    host = spawn_host("replica", dc, transport, env=env)
    try:
        spec = protocol.ActorSpec(name="replica.actor", cls=f"start_fails:{cls}")
        try:
            host.start([spec], timeout_s=30)
        except AsyncflowError:
            pass  # the failure in __init__ reaches the driver; the one in on_start only the log
        deadline = time.monotonic() + 20
        text = ""
        while "IndexError" not in text and time.monotonic() < deadline:  # on_start's failure is logged by its thread
            text = (logs / "replica.log").read_text() if (logs / "replica.log").exists() else ""
            time.sleep(0.05)
    finally:
        host.stop(timeout_s=10)
    assert "Traceback (most recent call last)" in text, text
    assert "in pick_position" in text and "IndexError: list index out of range" in text, text
