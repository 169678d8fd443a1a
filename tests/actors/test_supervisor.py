"""The Supervisor with its processes and directory stood in for: the roster of rollout
replicas while a pack of them is dead and restarting, and the restart of a pack."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from asyncflow.actors.driver import supervisor, topology
from asyncflow.actors.driver.supervisor import Supervisor
from asyncflow.actors.runtime import messages
from asyncflow.config import names
from asyncflow.config.load import load_config_text
from asyncflow.core import protocol
from asyncflow.core.transport import TransportConfig

EMULATED = '[rollout.engine]\ntype = "emulated"\n[train.engine]\ntype = "emulated"\n'


class Proc:
    """A host's process, as the Supervisor sees it."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def alive(self) -> bool:
        return self.returncode is None

    def kill(self) -> None:
        self.returncode = -9


def _supervisor(text: str) -> Supervisor:
    cfg = load_config_text(EMULATED + text)
    sup = Supervisor(cfg, Path("/run"))
    sup.plan(topology.plan_hosts(cfg, "/run"))
    for k, name in enumerate(sup.names()):
        sup._hosts[name].proc = Proc(1000 + k)
    return sup


@pytest.mark.timeout(10)
def test_the_roster_leaves_out_the_replicas_of_a_dead_pack_until_its_restart_begins():
    """Found by tests/chaos/test_chaos_scale.py: every version was announced to the 32 dead
    replicas of a killed pack, about 3 s each. A dead host's replicas are out of the roster
    from when its death is handled until its restart starts a new process (which asks the
    weights actor for the newest version as it starts: rollout/actor.py ``on_start``)."""
    sup = _supervisor("[rollout]\nnum_replicas = 6\n[cluster]\nactors_per_process = 2\n")
    everyone = [f"rollout.{i}" for i in range(6)]
    assert sup.replicas() == everyone
    record = sup._hosts["rollout.pack.1"]
    record.restart_at = 1e18  # dead and requeued (Supervisor._on_death): its restart is due later
    assert sup.replicas() == ["rollout.0", "rollout.1", "rollout.4", "rollout.5"]
    assert sup.workers() == ["loader", *everyone, "reward.0", names.TRAINER]  # still the run's workers (stop, stats)
    record.restart_at = None  # its restart began (Supervisor._restart)
    assert sup.replicas() == everyone


class Directory:
    """The directory as the Supervisor's restart uses it: each worker answers StartWork after ``delay_s``."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.started: list[str] = []
        self.lock = threading.Lock()

    def ref(self, name: str, wait_s: float = 10.0, refresh: bool = False):
        directory = self

        class Ref:
            def ask(self, msg, timeout_s: float = 30.0):
                assert isinstance(msg, messages.StartWork)
                time.sleep(directory.delay_s)  # its start: the catch-up with the newest weights
                with directory.lock:
                    directory.started.append(name)
                return protocol.Ok()

        return Ref()

    def unregister(self, name: str, address: str = "") -> None:
        pass


@pytest.mark.timeout(30)
def test_a_restarted_pack_is_told_to_start_work_all_at_once():
    """Found by tests/chaos/test_chaos_scale.py: the driver told the 16 (or 32) replicas of a
    restarted pack StartWork one after the other, each waiting for the replica's own start;
    the waits added up (and the driver's loop, which watches every other process, waited too)."""
    sup = _supervisor("[rollout]\nnum_replicas = 32\n[cluster]\nactors_per_process = 16\n")
    directory = Directory(delay_s=0.5)
    sup.attach(directory, TransportConfig(scheme="inproc"), {})
    spawned: list[str] = []
    sup.spawn = lambda name, dc, transport, specs=None, env=None: spawned.append(name) or Proc(2000)
    sup._hosts["rollout.pack.1"].restart_at = 0.0  # dead, requeued, due now
    began = time.monotonic()
    sup.check()
    took = time.monotonic() - began
    assert spawned == ["rollout.pack.1"]
    assert sorted(directory.started) == sorted(f"rollout.{i}" for i in range(16, 32))
    assert took < 4.0, f"{took:.1f} s: 16 replicas x 0.5 s told in turn take 8 s"
    assert sup._hosts["rollout.pack.1"].proc.pid == 2000 and sup._hosts["rollout.pack.1"].restart_at is None


class Queue:
    """The queue as the Supervisor's requeue uses it."""

    def __init__(self, dc, consumer: str = ""):
        pass

    def requeue(self, task: str, consumer: str, done_columns=()) -> int:
        return 1


class Told(Directory):
    """A directory whose ``weights`` records what it is told (or cannot be reached)."""

    def __init__(self, reachable: bool = True):
        super().__init__(0.0)
        self.told: list[messages.ReplicaRemoved] = []
        self.reachable = reachable

    def ref(self, name: str, wait_s: float = 10.0, refresh: bool = False):
        if name != names.WEIGHTS:
            return super().ref(name, wait_s, refresh)
        if not self.reachable:
            raise LookupError("no actor named 'weights' registered within 0.5 s")
        told = self.told

        class Ref:
            def tell(self, msg, timeout_s: float = 10.0):
                told.append(msg)

        return Ref()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("reachable", [True, False])
def test_the_replicas_of_a_dead_pack_give_up_their_swap_grant(monkeypatch, capsys, reachable):
    """Found by tests/chaos/test_chaos_scale.py: a replica of the killed pack held the swap grant,
    every live replica waited for it in AcquireSwap, and the trainer's checkpoint for them."""
    monkeypatch.setattr(supervisor, "TQClient", Queue)
    sup = _supervisor("[rollout]\nnum_replicas = 4\n[cluster]\nactors_per_process = 2\n")
    directory = Told(reachable)
    sup.attach(directory, TransportConfig(scheme="inproc"), {})
    sup.spawn = lambda name, dc, transport, specs=None, env=None: Proc(3000)
    sup._hosts["rollout.pack.1"].proc.kill()
    sup.check()
    assert [r["host"] for r in sup.restarts] == ["rollout.pack.1"] and sup._hosts["rollout.pack.1"].proc.pid == 3000
    if reachable:
        assert directory.told == [messages.ReplicaRemoved(replica=r, dead=True) for r in ("rollout.2", "rollout.3")]
    else:  # named, and the run goes on
        assert "could not tell the weight sync that the replicas of rollout.pack.1 died" in capsys.readouterr().err


@pytest.mark.timeout(10)
def test_the_gateway_fronts_roster_keeps_a_restarting_replica_and_follows_the_planners_adds_and_removes():
    """The front routes sessions over ``Supervisor.replica_indices``: a replica restarting in place
    keeps its sessions (it is in the list), one the planner adds is in it, one it removes is not."""
    sup = _supervisor("[rollout]\nnum_replicas = 2\n")
    sup.attach(Directory(0.0), TransportConfig(scheme="inproc"), {})
    sup.spawn = lambda name, dc, transport, specs=None, env=None: Proc(3000)
    assert sup.replica_indices() == [0, 1]
    sup._hosts["rollout.1"].restart_at = 1e18  # dead, its restart due later
    assert sup.replicas() == ["rollout.0"] and sup.replica_indices() == [0, 1]
    cfg = sup.cfg
    sup.add(topology.role_host(topology.built_in(names.ROLLOUT), "rollout.2", topology.layout([], cfg), "/run"))
    assert sup.replica_indices() == [0, 1, 2]
    sup.remove("rollout.0")
    assert sup.replica_indices() == [1, 2]
