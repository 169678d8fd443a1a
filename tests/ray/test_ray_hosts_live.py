"""RayHosts against a local Ray cluster, in this process (marked ``ray``)."""

from __future__ import annotations

import time

import msgspec
import pytest

from asyncflow.actors.ray_hosts import RayHosts
from asyncflow.config.cluster import ClusterConfig
from asyncflow.core import protocol
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.transport import TransportConfig


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

        broken = msgspec.structs.replace(transport, max_message_bytes=0)  # the host refuses it and exits
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"'bad' on node .* exited with code 1 before it registered"):
            hosts.spawn("bad", dc, broken, timeout_s=120)
        assert time.monotonic() - started < 60  # not the whole timeout

        good.stop(timeout_s=20)
        assert not good.alive() and good.returncode == 0
    finally:
        directory.stop()
        hosts.close()
