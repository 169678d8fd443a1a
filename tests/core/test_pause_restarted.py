"""A checkpoint pauses every role; a role whose process was killed and restarted at a
new address must be asked there, not waited for at the dead one (the chaos suite found
the trainer blocked 600 s in ``Pause`` after a worker died)."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest

from asyncflow.actors.runtime import messages
from asyncflow.actors.trainer._pause import pause_role
from asyncflow.core import protocol
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.errors import ActorGone, ActorTimeout
from asyncflow.core.host import spawn_host
from asyncflow.core.transport import TransportConfig

HERE = Path(__file__).resolve().parent
SPEC = protocol.ActorSpec(name="worker", cls="pausable_actor:PausableActor")


@pytest.fixture
def cluster(request, tmp_path):
    transport = TransportConfig(scheme=request.param, secret="s", ipc_dir=str(tmp_path))
    directory = start_directory(transport)
    client = DirectoryClient(directory.address, transport)
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    hosts = []

    def start(name: str):
        hosts.append(spawn_host(name, client, transport, [SPEC], env=env))
        return hosts[-1]

    yield client, start
    for host in hosts:
        host.stop(timeout_s=5)
    directory.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cluster", ["ipc", "tcp"], indirect=True)
def test_a_role_restarted_at_a_new_address_is_paused_there(cluster):
    client, start = cluster
    first = start("a")
    stale = client.ref("worker")  # what a role's cached reference holds
    assert pause_role(lambda n: client.ref(n, refresh=True), "worker")[1].state == str(first.pid).encode()

    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait(timeout=10)
    # the premise: an ask to the dead address gets no answer. It waits out its timeout, or, when the
    # reset of the old connection reaches the socket during the ask (a loaded machine), fails as gone
    with pytest.raises((ActorTimeout, ActorGone)):
        stale.ask(messages.Pause(), timeout_s=1.0)
    second = start("b")  # the restart registers the same name at a new address
    assert client.ref("worker", refresh=True).address != stale.address

    answers = iter([stale])  # the first lookup still names the dead process (it died just after)

    def lookup(name):
        return next(answers, None) or client.ref(name, refresh=True)

    began = time.monotonic()
    ref, paused = pause_role(lookup, "worker", deadline_s=30, poll_s=0.5)
    assert paused.state == str(second.pid).encode() and ref.address != stale.address
    assert time.monotonic() - began < 25  # not the whole deadline


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cluster", ["ipc"], indirect=True)
def test_a_role_that_never_comes_back_fails_the_pause_at_the_deadline_naming_it(cluster):
    client, start = cluster
    host = start("a")
    os.kill(host.pid, signal.SIGKILL)
    host.proc.wait(timeout=10)
    with pytest.raises(ActorTimeout, match="worker"):
        pause_role(lambda n: client.ref(n, refresh=True), "worker", deadline_s=2.0, poll_s=0.5)


class _Answering:
    name, address = "worker", "ipc:///tmp/worker-new.sock"

    def ask(self, msg, timeout_s: float = 30.0):
        return messages.Paused(role="worker", state=b"restarted")


@pytest.mark.timeout(30)
def test_a_role_not_in_the_directory_at_the_first_lookup_is_looked_up_again_until_it_registers(caplog):
    """Found by tests/chaos/test_chaos_scale.py: a checkpoint began while a killed pack of
    replicas was being restarted, the first lookup of a replica's name raised LookupError (its
    dead instance unregistered, the new one not registered yet), and the trainer failed."""
    caplog.set_level(logging.INFO, logger="asyncflow.actors.trainer._pause")
    looked = []

    def lookup(name):
        looked.append(name)
        if len(looked) <= 3:
            raise LookupError(f"no actor named {name!r} registered within 1 s")
        return _Answering()

    ref, paused = pause_role(lookup, "worker", deadline_s=20, poll_s=0.05)
    assert paused.state == b"restarted" and ref.address == _Answering.address and len(looked) == 4
    assert "pause worker: not in the directory" in caplog.text


@pytest.mark.timeout(30)
def test_a_role_that_never_registers_fails_the_pause_at_the_deadline_naming_it():
    def lookup(name):
        raise LookupError(f"no actor named {name!r} registered within 1 s")

    began = time.monotonic()
    with pytest.raises(ActorTimeout, match="worker"):
        pause_role(lookup, "worker", deadline_s=1.0, poll_s=0.05)
    assert time.monotonic() - began < 5


class _Restarted:
    """A role's new instance, registered once its restart is done."""

    def __init__(self, name: str):
        self.name, self.address = name, f"ipc:///tmp/{name}-new.sock"

    def ask(self, msg, timeout_s: float = 30.0):
        return messages.Paused(role=self.name, state=self.name.encode())


@pytest.mark.timeout(30)
def test_roles_restarting_together_are_paused_together_not_one_deadline_after_another():
    """Found by tests/chaos/test_chaos_scale.py: a killed pack of 32 replicas cost a checkpoint a
    round per replica, one after the other. Here each of two restarting roles registers only once
    the other has been looked up too (their pack restarts as one): asked one at a time, the first
    waits out its deadline."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from asyncflow.actors.trainer._pause import pause_roles

    looked = {"rollout.0": threading.Event(), "rollout.1": threading.Event()}

    def lookup(name):
        looked[name].set()
        if not all(e.is_set() for e in looked.values()):
            raise LookupError(f"no actor named {name!r} registered within 1 s")
        return _Restarted(name)

    paused: list = []
    with ThreadPoolExecutor(max_workers=4) as pool:
        states = pause_roles(lookup, ["rollout.0", "rollout.1"], paused, pool, deadline_s=10.0, poll_s=0.05)
    assert states == {"rollout.0": b"rollout.0", "rollout.1": b"rollout.1"}
    assert [ref.name for ref in paused] == ["rollout.0", "rollout.1"]


@pytest.mark.timeout(30)
def test_a_role_that_cannot_be_paused_fails_the_checkpoint_after_the_others_are_paused_and_listed_for_resume():
    from concurrent.futures import ThreadPoolExecutor

    from asyncflow.actors.trainer._pause import pause_roles

    def lookup(name):
        if name == "rollout.1":
            raise LookupError(f"no actor named {name!r} registered within 1 s")
        return _Restarted(name)

    paused: list = []
    with ThreadPoolExecutor(max_workers=4) as pool, pytest.raises(ActorTimeout, match="rollout.1"):
        pause_roles(lookup, ["rollout.0", "rollout.1", "reward"], paused, pool, deadline_s=0.5, poll_s=0.05)
    assert [ref.name for ref in paused] == ["rollout.0", "reward"]  # resumed by the caller
