"""What a Ray-placed host reserves and where it listens (no Ray needed)."""

from __future__ import annotations

import pytest

from asyncflow.actors.ray_hosts import CPU_PER_HOST, RayHosts, node_transport
from asyncflow.config.cluster import ClusterConfig
from asyncflow.config.load import ConfigError
from asyncflow.core.transport import TransportConfig

DEVICES = {"queue": 0, "rollout.0": 1, "reference.0": 1, "trainer": 4}.get
"""Host -> devices it uses (the supervisor's count, from each role's RoleSpec: test_topology.py)."""


def test_hosts_without_devices_reserve_a_fraction_of_a_cpu():
    hosts = RayHosts(ClusterConfig(launcher="ray"), DEVICES)
    assert {hosts.bundle(h)["CPU"] for h in ("queue", "rollout.0", "trainer")} == {CPU_PER_HOST} and CPU_PER_HOST < 1
    assert all(len(hosts.bundle(h)) == 1 for h in ("queue", "rollout.0", "trainer"))


def test_devices_are_reserved_by_ray_resource_name():
    gpu = RayHosts(ClusterConfig(launcher="ray", device="cuda", train_devices=[0, 1, 2, 3]), DEVICES)
    assert gpu.bundle("rollout.0")["GPU"] == 1 and gpu.bundle("trainer")["GPU"] == 4
    assert "GPU" not in gpu.bundle("queue")
    npu = RayHosts(ClusterConfig(launcher="ray", device="npu"), DEVICES)
    assert npu.bundle("reference.0")["NPU"] == 1


def test_each_node_listens_on_its_own_ip_or_advertises_it_behind_a_wildcard():
    bound = node_transport(TransportConfig(scheme="tcp", bind_host="127.0.0.1", secret="s"), "10.0.0.7")
    assert bound.bind_host == "10.0.0.7" and bound.advertise_host == ""
    wild = node_transport(TransportConfig(scheme="tcp", bind_host="0.0.0.0", secret="s"), "10.0.0.7")
    assert wild.bind_host == "0.0.0.0" and wild.advertise_host == "10.0.0.7"


@pytest.mark.parametrize(
    "transport,fix",
    [
        (TransportConfig(scheme="ipc"), "scheme = 'tcp'"),
        (TransportConfig(scheme="tcp"), "ASYNCFLOW_SECRET"),
    ],
)
def test_the_ray_launcher_says_what_to_change_in_the_transport(transport, fix, monkeypatch):
    monkeypatch.delenv("ASYNCFLOW_SECRET", raising=False)
    with pytest.raises(ConfigError, match=fix):
        RayHosts(ClusterConfig(launcher="ray"), DEVICES).connect(transport)
