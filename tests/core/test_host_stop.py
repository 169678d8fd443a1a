"""A process host's stop path runs to the end whatever an actor does: an actor that does
not stop in time is named in one line and the host exits at once, no traceback (a
host orphaned by a killed driver once printed a pykka Timeout traceback)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from asyncflow.actors.runtime import messages
from asyncflow.core import protocol
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.host import PARENT_ENV, TRANSPORT_ENV, HostProcess
from asyncflow.core.transport import TransportConfig

HERE = Path(__file__).resolve().parent


@pytest.mark.timeout(90)
def test_a_host_whose_actor_hangs_names_it_in_one_line_and_exits_at_once(tmp_path):
    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path))
    directory = start_directory(transport)
    client = DirectoryClient(directory.address, transport)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    env[TRANSPORT_ENV], env[PARENT_ENV] = transport.to_env(), str(os.getpid())
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncflow.core.host", "--name", "h", "--directory", directory.address],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        HostProcess("h", proc, client).start([protocol.ActorSpec(name="stuck", cls="pausable_actor:StuckActor")])
        client.ref("stuck").tell(messages.Pause())  # it is now inside a unit that hangs
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        directory.stop()
    assert "Traceback" not in err, err
    assert "stuck did not stop cleanly (Timeout" in err and "going on with the rest of the stop" in err, err
    assert proc.returncode == 1 and "exiting with stuck still running" in err, err  # at once, not at the exit timer


@pytest.mark.timeout(90)
def test_the_driver_stopping_a_host_with_a_hung_actor_ends_its_process(tmp_path):
    """The driver's HostProcess.stop must end the process whatever its Stop answers: it
    raised RemoteError (the host's pykka Timeout) and left the process running while
    the driver went on, to an automatic resume that started a second set of processes."""
    from asyncflow.core.host import spawn_host

    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path))
    directory = start_directory(transport)
    client = DirectoryClient(directory.address, transport)
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    host = spawn_host("h", client, transport, [protocol.ActorSpec(name="stuck", cls="pausable_actor:StuckActor")], env=env)
    try:
        client.ref("stuck").tell(messages.Pause())
        host.stop(timeout_s=20)
        assert not host.alive()
    finally:
        if host.alive():
            host.kill()
        directory.stop()
