"""RayHosts against a local Ray cluster, in this process (marked ``ray``)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import time
from pathlib import Path

import pytest

from asyncflow.actors.driver.ray_hosts import RayHosts
from asyncflow.config.cluster import ClusterConfig
from asyncflow.config.load import ConfigError
from asyncflow.core import protocol
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.transport import TransportConfig

STARTUP = str(Path(__file__).parent / "startup")  # its sitecustomize: a barrier, or an exit


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_host_is_placed_on_its_node_address_and_one_dying_at_start_is_reported_at_once(ray_env, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", ray_env["RAY_ADDRESS"])
    hosts = RayHosts(ClusterConfig(launcher="ray"), lambda host: 0)  # hosts without devices
    transport = hosts.connect(TransportConfig(scheme="tcp", bind_host="0.0.0.0", secret="live-secret"))
    directory = start_directory(transport)
    try:
        dc = DirectoryClient(directory.address, transport)
        good = hosts.spawn("good", dc, transport, timeout_s=120)
        entry = dc.lookup("host.good")
        assert good.alive() and entry.address.startswith(f"tcp://{good.node_ip}:") and entry.pid == good.pid
        assert dc.ref("host.good").ask(protocol.Ping(), timeout_s=5).name == "host.good"
        assert hosts.heartbeat.lost() == {}

        dies = {"PYTHONPATH": STARTUP, "AF_TEST_EXIT": "1"}  # the host exits as it starts
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"'bad' on node .* exited with code 1 before it registered"):
            hosts.spawn("bad", dc, transport, env=dies, timeout_s=120)
        assert time.monotonic() - started < 60  # not the whole timeout

        good.stop(timeout_s=20)
        assert not good.alive() and good.returncode == 0
    finally:
        directory.stop()
        hosts.close()


@pytest.fixture
def placed(ray_env, monkeypatch):
    """A function that joins the local Ray cluster with a cluster config, and its directory."""
    monkeypatch.setenv("RAY_ADDRESS", ray_env["RAY_ADDRESS"])
    made = []

    def join(bind_host: str = "127.0.0.1", **cluster) -> tuple[RayHosts, DirectoryClient, TransportConfig]:
        hosts = RayHosts(ClusterConfig(launcher="ray", **cluster), lambda host: 0)
        transport = hosts.connect(TransportConfig(scheme="tcp", bind_host=bind_host, secret="live-secret"))
        directory = start_directory(transport)
        made.append((hosts, directory))
        return hosts, DirectoryClient(directory.address, transport), transport

    yield join
    for hosts, directory in made:
        for host in list(hosts.handles.values()):
            host.kill()
        directory.stop()
        hosts.close()


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_the_hosts_of_a_launch_wave_all_run_before_any_of_them_registers(placed, tmp_path):
    """Each host waits in its start-up until all eight have started: hosts started one
    after another (each awaited until it registers) never get past the first."""
    hosts, dc, transport = placed()
    env = {"PYTHONPATH": STARTUP, "AF_TEST_BARRIER": f"{tmp_path}:8"}
    names = [f"wave.{i}" for i in range(8)]
    started = hosts.spawn_many(dc, transport, {name: env for name in names}, timeout_s=120)
    assert sorted(started) == names and len(os.listdir(tmp_path)) == 8
    for name, host in started.items():
        assert host.alive() and dc.lookup(f"host.{name}").pid == host.pid
    assert hosts.heartbeat.lost() == {}


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_host_of_a_wave_that_dies_at_start_is_named_and_the_whole_wave_is_taken_down(placed):
    hosts, dc, transport = placed()
    envs = {"fine.0": {}, "dies": {"PYTHONPATH": STARTUP, "AF_TEST_EXIT": "3"}, "fine.1": {}}
    with pytest.raises(RuntimeError, match=r"'dies' on node 127\.0\.0\.1 exited with code 3 before it registered"):
        hosts.spawn_many(dc, transport, envs, timeout_s=120)
    assert hosts.handles == {} and _ray_free_cpu() == _ray_total_cpu()  # every reservation given back


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_a_wave_that_needs_more_cpu_than_the_cluster_has_is_refused_at_once_in_one_line(placed):
    hosts, dc, transport = placed(ray_cpus_per_host=0.5)
    total = _ray_total_cpu()  # the test cluster's (conftest.py)
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        hosts.spawn_many(dc, transport, {f"h.{i}": {} for i in range(int(total / 0.5) + 1)}, timeout_s=120)
    message = str(refused.value)
    assert time.monotonic() - started < 10 and "\n" not in message, message
    assert f"{int(total / 0.5) + 1} process hosts" in message and f"has {total:g} CPU" in message, message
    assert hosts.handles == {} and _ray_free_cpu() == total


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_loopback_run_under_ray_binds_and_dials_nothing_but_loopback(placed, ray_head):
    import ray

    hosts, dc, transport = placed()
    started = hosts.spawn_many(dc, transport, {"lo.0": {}, "lo.1": {}}, timeout_s=120)
    assert [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]] == ["127.0.0.1"]
    assert ray.util.get_node_ip_address() == "127.0.0.1" and transport.bind_host == "127.0.0.1"
    entries = dc.list()
    assert entries and all(e.address.startswith("tcp://127.0.0.1:") for e in entries), entries
    pids = {os.getpid(), ray_head.pid, *(h.pid for h in started.values())}
    sockets = _tcp_sockets(_with_descendants(pids))
    assert sockets, "no socket found: the check would pass for nothing"
    off = [(pid, local, remote) for pid, local, remote in sockets if not (_loopback(local) and _loopback(remote, listening=True))]
    assert off == [], off


def _ray_total_cpu() -> float:
    import ray

    return ray.cluster_resources()["CPU"]


def _ray_free_cpu() -> float:
    """The free CPU once Ray has settled (a removed placement group is freed a moment later)."""
    import ray

    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0.0) < _ray_total_cpu() and time.monotonic() < deadline:
        time.sleep(0.2)
    return ray.available_resources().get("CPU", 0.0)


def _with_descendants(pids: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def _tcp_sockets(
    pids: set[int],
) -> list[tuple[int, ipaddress.IPv4Address | ipaddress.IPv6Address, ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    """(pid, local address, remote address) of every tcp socket (v4 and v6) these processes hold."""
    owner: dict[str, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        owner[link[8:-1]] = pid
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in owner:
                found.append((owner[fields[9]], _address(fields[1]), _address(fields[2])))
    return found


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of /proc/net/tcp{,6}: 32-bit words in host (little-endian) order."""
    words = bytes.fromhex(hex_address.split(":")[0])
    raw = b"".join(words[i : i + 4][::-1] for i in range(0, len(words), 4))
    return ipaddress.ip_address(raw)


def _loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address, listening: bool = False) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or (listening and address.is_unspecified)
