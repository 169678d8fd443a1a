"""What a Ray-placed host reserves and where it listens (no Ray needed)."""

from __future__ import annotations

import pytest

from asyncflow.actors.driver.ray_hosts import RayHosts, capacity_error, loopback_error, node_transport
from asyncflow.config.cluster import ClusterConfig
from asyncflow.config.load import ConfigError, load_config_text
from asyncflow.core.transport import TransportConfig

DEVICES = {"queue": 0, "rollout.0": 1, "reference.0": 1, "trainer": 4}.get
"""Host -> devices it uses (the supervisor's count, from each role's RoleSpec: test_topology.py)."""


@pytest.mark.timeout(30)
def test_hosts_without_devices_reserve_a_fraction_of_a_cpu():
    hosts = RayHosts(ClusterConfig(launcher="ray"), DEVICES)
    assert {hosts.bundle(h)["CPU"] for h in ("queue", "rollout.0", "trainer")} == {0.1}
    assert all(len(hosts.bundle(h)) == 1 for h in ("queue", "rollout.0", "trainer"))


@pytest.mark.timeout(30)
def test_the_cpu_each_host_reserves_is_the_config_key_ray_cpus_per_host():
    cpu = RayHosts(ClusterConfig(launcher="ray", ray_cpus_per_host=0.25), DEVICES)
    gpu = RayHosts(ClusterConfig(launcher="ray", device="cuda", ray_cpus_per_host=2.0), DEVICES)
    assert cpu.bundle("queue") == {"CPU": 0.25} and gpu.bundle("rollout.0") == {"CPU": 2.0, "GPU": 1.0}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value", ["0", "-0.1"])
def test_a_cpu_reservation_that_is_not_positive_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"cluster\.ray_cpus_per_host = .*use a value > 0"):
        load_config_text(f"[cluster]\nray_cpus_per_host = {value}\n")


@pytest.mark.timeout(30)
def test_more_hosts_than_the_ray_cluster_has_cpu_for_is_one_line_with_the_figures_and_both_fixes():
    free = {"CPU": 2.0, "memory": 9e9, "node:127.0.0.1": 1.0}
    free |= {f"CPU_group_{i}abc": 0.1 for i in range(30)} | {f"bundle_group_{i}abc": 1000.0 for i in range(30)}
    error = capacity_error([{"CPU": 0.1}] * 21, free, 0.1)
    assert "\n" not in error and "group" not in error, error
    for figure in ("21 process hosts", "ray_cpus_per_host = 0.1", "2.1 CPU in all", "has 2 CPU"):
        assert figure in error, (figure, error)
    assert "lower [cluster] ray_cpus_per_host to 0.0952 or less" in error and "--num-cpus 3" in error, error


@pytest.mark.timeout(30)
def test_hosts_that_fill_the_ray_cluster_exactly_are_not_refused():
    assert capacity_error([{"CPU": 0.1}] * 20, {"CPU": 2.0}, 0.1) == ""  # 20 x 0.1 is 2.0000000000000004 in floats
    assert capacity_error([{"CPU": 0.1, "GPU": 1.0}] * 4, {"CPU": 2.0, "GPU": 4.0}, 0.1) == ""


@pytest.mark.timeout(30)
def test_more_devices_than_the_ray_cluster_has_are_refused_with_the_figures():
    error = capacity_error([{"CPU": 0.1, "GPU": 4.0}] + [{"CPU": 0.1, "GPU": 1.0}] * 2, {"CPU": 8.0, "GPU": 4.0}, 0.1)
    assert "\n" not in error and "6 GPU" in error and "has 4 GPU" in error and "num_replicas" in error, error


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "bind_host,address,nodes,refused",
    [
        ("127.0.0.1", "127.0.0.1:6379", ["127.0.0.1"], ""),
        ("127.0.0.1", "auto", ["127.0.0.1"], ""),
        ("127.0.0.1", "10.0.0.7:6379", [], "10.0.0.7:6379"),  # refused before Ray dials it
        ("127.0.0.1", "auto", ["127.0.0.1", "10.0.0.8"], "10.0.0.8"),
        ("0.0.0.0", "10.0.0.7:6379", ["10.0.0.7", "10.0.0.8"], ""),  # several machines: any address
    ],
)
def test_a_loopback_transport_refuses_a_ray_cluster_off_loopback_in_one_line_with_the_fix(bind_host, address, nodes, refused):
    error = loopback_error(bind_host, address, nodes)
    if not refused:
        assert error == ""
        return
    assert refused in error and "\n" not in error
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in error and "bind_host" in error, error


@pytest.mark.timeout(30)
def test_devices_are_reserved_by_ray_resource_name():
    gpu = RayHosts(ClusterConfig(launcher="ray", device="cuda", train_devices=[0, 1, 2, 3]), DEVICES)
    assert gpu.bundle("rollout.0")["GPU"] == 1 and gpu.bundle("trainer")["GPU"] == 4
    assert "GPU" not in gpu.bundle("queue")
    npu = RayHosts(ClusterConfig(launcher="ray", device="npu"), DEVICES)
    assert npu.bundle("reference.0")["NPU"] == 1


@pytest.mark.timeout(30)
def test_each_node_listens_on_its_own_ip_or_advertises_it_behind_a_wildcard():
    bound = node_transport(TransportConfig(scheme="tcp", bind_host="127.0.0.1", secret="s"), "10.0.0.7")
    assert bound.bind_host == "10.0.0.7" and bound.advertise_host == ""
    wild = node_transport(TransportConfig(scheme="tcp", bind_host="0.0.0.0", secret="s"), "10.0.0.7")
    assert wild.bind_host == "0.0.0.0" and wild.advertise_host == "10.0.0.7"


@pytest.mark.timeout(30)
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
