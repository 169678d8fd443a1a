"""Several hosts on one machine as network namespaces: the actors' traffic crosses
between them over TCP with the cluster secret, a peer without it is refused, and a
cut link is detected and reported by name.

Layout (see _lab.py): pytest is the driver in the root namespace; node 0 runs the
directory; nodes 1..3 run process hosts, each bound to its own 10.213.X.Y address.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from asyncflow.actors.driver._heartbeat import Heartbeat
from asyncflow.core import protocol
from asyncflow.core.actor import serve_actor
from asyncflow.core.echo import EchoActor
from asyncflow.core.errors import ActorTimeout, RemoteError, Unauthorized
from asyncflow.core.ref import ActorRef
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.launch import queue_specs
from asyncflow.core.transport import TransportConfig

ECHO = "asyncflow.core.echo:EchoActor"
RELAY = "_relay:RelayActor"


def _host_of(address: str) -> str:
    return address.removeprefix("tcp://").rpartition(":")[0]


def test_actors_in_different_namespaces_talk_over_tcp_on_their_own_addresses(cluster):
    lab = cluster.lab
    cluster.spawn_host("a", node=1)
    cluster.spawn_host("b", node=2)
    echo = cluster.start("a", "echo.a", ECHO)
    relay = cluster.start("b", "relay.b", RELAY)
    assert _host_of(echo.address) == lab.addresses[1] and _host_of(relay.address) == lab.addresses[2]
    registered = {e.name: _host_of(e.address) for e in cluster.dc.list()}
    assert registered["host.a"] == lab.addresses[1] and registered["host.b"] == lab.addresses[2]

    # driver (root namespace) -> relay.b (node 2) -> directory (node 0) -> echo.a (node 1) and back
    reply = cluster.dc.ref("relay.b").ask(protocol.Echo(payload=b"echo.a"), timeout_s=15)
    assert bytes(reply.payload) == f"from {relay.address} | reached {echo.address}".encode()
    pong = cluster.dc.ref("echo.a").ask(protocol.Ping(), timeout_s=5)
    assert pong.name == "echo.a" and pong.num_rejected_frames == 0


def test_queue_rows_cross_namespaces_between_manager_shard_and_client(cluster):
    cluster.spawn_host("queue", node=1)
    cluster.spawn_host("shard", node=2)
    q = queue_specs(["train"], num_shards=1, capacity_rows=64, stripe_rows=4)
    cluster.hosts["queue"].start([q.manager, *q.controllers], timeout_s=30)
    cluster.hosts["shard"].start(q.shards, timeout_s=30)
    tq = TQClient(cluster.dc, reserve_rows=0, timeout_s=15)
    assert not tq.use_shm  # tcp peers: every byte goes over the veth links
    metas = tq.allocate(3, step=0)
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal(n).astype(np.float32) for n in (5, 1 << 20, 17)]  # 4 MiB in the middle
    tq.put([m.index for m in metas], {"x": rows}, metas)
    batch = tq.get_batch("train", ["x"], 3)
    by_index = {m.index: r for m, r in zip(metas, rows)}
    for k, index in enumerate(batch.indices):
        np.testing.assert_array_equal(batch.columns["x"][k], by_index[index])
    tq.ack(batch)
    tq.close()


def test_a_peer_without_the_secret_is_refused(cluster, monkeypatch):
    lab = cluster.lab
    monkeypatch.delenv("ASYNCFLOW_SECRET", raising=False)
    cluster.spawn_host("a", node=1)
    echo = cluster.start("a", "echo.a", ECHO)
    for secret in ("wrong", ""):
        stranger = TransportConfig(scheme="tcp", bind_host=lab.driver_address, secret=secret)
        with pytest.raises(Unauthorized, match="echo.a.*secret"):
            ActorRef("echo.a", echo.address, stranger).ask(protocol.Echo(payload=b"let me in"), timeout_s=5)
    # a stranger in another namespace, with no secret at all
    probe = (
        "import sys; from asyncflow.core import protocol; from asyncflow.core.ref import ActorRef\n"
        "from asyncflow.core.transport import TransportConfig\n"
        "try:\n"
        f"    ActorRef('echo.a', {echo.address!r}, TransportConfig(scheme='tcp')).ask(protocol.Echo(), timeout_s=5)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run(
        lab.command(3, [sys.executable, "-c", probe]),
        capture_output=True,
        text=True,
        timeout=60,
        env={
            k: v
            for k, v in cluster._env(cluster.transport(lab.addresses[3])).items()
            if k not in ("ASYNCFLOW_SECRET", "ASYNCFLOW_TRANSPORT")
        },
    )
    assert out.stdout.startswith("Unauthorized"), out.stdout + out.stderr
    assert cluster.dc.ref("echo.a").ask(protocol.Ping(), timeout_s=5).num_rejected_frames == 3


def test_a_wildcard_bind_registers_the_advertised_node_address(cluster):
    lab = cluster.lab
    cluster.spawn_host("w", node=3, transport=cluster.transport("0.0.0.0", advertise_host=lab.addresses[3]))
    echo = cluster.start("w", "echo.w", ECHO)
    assert _host_of(echo.address) == lab.addresses[3]
    assert _host_of(cluster.dc.lookup("host.w").address) == lab.addresses[3]
    assert bytes(cluster.dc.ref("echo.w").ask(protocol.Echo(payload=b"hi"), timeout_s=5).payload) == b"hi"


def test_a_wildcard_bind_without_an_advertised_address_is_refused_with_the_fix():
    wildcard = TransportConfig(scheme="tcp", bind_host="0.0.0.0", secret="s").validate()  # valid: ray fills it in
    with pytest.raises(ValueError, match="advertise_host"):
        serve_actor(EchoActor, "echo", wildcard)


def test_a_cut_link_is_reported_naming_the_actor_and_the_heartbeat_names_the_lost_host(cluster):
    lab = cluster.lab
    hosts = {"a": cluster.spawn_host("a", node=1), "b": cluster.spawn_host("b", node=2)}
    echo = cluster.start("a", "echo.a", ECHO)
    cluster.start("b", "relay.b", RELAY)
    beat = Heartbeat(cluster.driver_transport, interval_s=0.5, lost_after_s=2.0)
    for name in hosts:
        beat.watch(name, f"host.{name}", cluster.dc.lookup(f"host.{name}").address)
    beat.start()
    try:
        time.sleep(1.0)  # a few answered rounds first
        assert beat.lost() == {}
        lab.cut(1)
        cut_at = time.monotonic()
        while "a" not in beat.lost() and time.monotonic() - cut_at < 10:
            time.sleep(0.1)
        detected_s = time.monotonic() - cut_at
        lost = beat.lost()
        assert list(lost) == ["a"] and lab.addresses[1] in lost["a"], lost
        assert detected_s < 5
        with pytest.raises(ActorTimeout, match=r"'echo\.a' at " + echo.address):
            cluster.dc.ref("echo.a").ask(protocol.Echo(payload=b"anyone?"), timeout_s=2)
        # an actor on another node asking the cut one gets the same report, passed back to us
        with pytest.raises(RemoteError, match=r"ActorTimeout.*'echo\.a'"):
            cluster.dc.ref("relay.b").ask(protocol.Echo(payload=b"echo.a"), timeout_s=15)
        print(f"\nlost host reported {detected_s:.1f} s after the cut: {lost['a']}")
        lab.restore(1)
        deadline = time.monotonic() + 15
        while beat.lost() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert beat.lost() == {}  # the link back: the host answers again, nothing was restarted
        assert hosts["a"].alive()
    finally:
        beat.stop()


def test_a_host_cut_off_and_replaced_never_removes_its_successors_entry_when_it_comes_back(cluster):
    lab = cluster.lab
    old = cluster.spawn_host("a", node=1)
    cluster.start("a", "echo.a", ECHO)
    cluster.hosts["a (cut off)"] = old
    lab.cut(1)
    cluster.dc.unregister("echo.a")  # what the launcher does before it starts a successor
    cluster.spawn_host("a", node=2)  # the successor, same names, on another node
    echo = cluster.start("a", "echo.a", ECHO)
    successor = cluster.dc.lookup("host.a").address
    assert _host_of(successor) == lab.addresses[2]
    lab.restore(1)
    old.proc.terminate()  # the old process comes back and stops: it unregisters what it registered
    assert old.proc.wait(timeout=30) == 0
    assert cluster.dc.lookup("host.a").address == successor
    assert cluster.dc.lookup("echo.a").address == echo.address
    assert cluster.dc.ref("echo.a", refresh=True).ask(protocol.Ping(), timeout_s=5).name == "echo.a"


def test_listeners_take_ports_from_the_configured_range_for_firewalls(cluster):
    lab = cluster.lab
    cluster.spawn_host("p", node=3, transport=cluster.transport(lab.addresses[3], ports="42100-42109"))
    entries = [cluster.start("p", f"echo.p{i}", ECHO) for i in range(3)] + [cluster.dc.lookup("host.p")]
    ports = {int(e.address.rpartition(":")[2]) for e in entries}
    assert len(ports) == 4 and all(42100 <= p <= 42109 for p in ports)
    assert all(_host_of(e.address) == lab.addresses[3] for e in entries)
    assert bytes(cluster.dc.ref("echo.p2").ask(protocol.Echo(payload=b"in range"), timeout_s=5).payload) == b"in range"


def test_a_port_range_too_small_for_the_actors_says_to_widen_it():
    one_port = TransportConfig(scheme="tcp", ports="42199-42199")
    first = serve_actor(EchoActor, "echo.first", one_port)
    try:
        with pytest.raises(ValueError, match="ports = '42199-42199' is taken.*widen the range"):
            serve_actor(EchoActor, "echo.second", one_port)
    finally:
        first.stop()
    with pytest.raises(ValueError, match="write a range such as"):
        TransportConfig(scheme="tcp", ports="42199").validate()


def test_trainer_style_ranks_in_two_namespaces_rendezvous_through_the_directory_and_reduce_over_gloo(cluster):
    """What trainer ranks on two nodes do: rank 0 publishes its torch.distributed store
    (on its node's address) in the directory, rank 1 finds it there; gloo then runs
    between the namespaces on the interfaces of their own addresses."""
    from concurrent.futures import ThreadPoolExecutor

    lab = cluster.lab
    cluster.spawn_host("r0", node=1)
    cluster.spawn_host("r1", node=2)
    for rank, host in enumerate(("r0", "r1")):
        cluster.start(host, f"probe.{rank}", "_relay:DistProbeActor", rank=rank, world_size=2)
    refs = [cluster.dc.ref(f"probe.{rank}") for rank in range(2)]
    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda ref: bytes(ref.ask(protocol.Echo(payload=b""), timeout_s=60).payload), refs))
    expected_checksum = int(np.arange(1 << 18, dtype=np.float64).sum())
    for reply in replies:
        total, checksum, interface = reply.decode().split(" ")
        assert int(total) == 3 and int(checksum) == expected_checksum
        assert interface and interface != "lo", reply  # pinned to the node's own interface
    store = cluster.dc.lookup("dist.probe")
    assert _host_of(store.address) == lab.addresses[1]  # on rank 0's node, not loopback
