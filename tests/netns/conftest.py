"""Fixtures of the namespace tests: a lab of network namespaces, a directory in node 0,
process hosts in the other nodes, each bound to its own address with the secret.

Run: ``timeout 600 python -m pytest tests/netns -q`` (as root; skipped otherwise).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import _lab
import msgspec
import pytest

from asyncflow.core import protocol
from asyncflow.core.directory import DirectoryClient
from asyncflow.core.host import PARENT_ENV, HostProcess
from asyncflow.core.transport import TRANSPORT_ENV, TransportConfig

HERE = Path(__file__).parent
REPO = HERE.parent.parent
SECRET = "netns-test-secret"


class Cluster:
    """A directory on node 0 and one process host per other node."""

    def __init__(self, lab: _lab.Lab):
        self.lab = lab
        self.procs: list[subprocess.Popen] = []
        self.hosts: dict[str, HostProcess] = {}
        self.driver_transport = self.transport(lab.driver_address)

    def transport(self, bind_host: str, **changes) -> TransportConfig:
        return TransportConfig(scheme="tcp", bind_host=bind_host, secret=SECRET, connect_timeout_s=5.0, **changes)

    def _env(self, transport: TransportConfig) -> dict[str, str]:
        path = os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")])
        return {
            **os.environ,
            TRANSPORT_ENV: transport.to_env(),
            PARENT_ENV: str(os.getpid()),
            "PYTHONPATH": path,
            "OMP_NUM_THREADS": "1",
        }

    def start_directory(self) -> None:
        transport = self.transport(self.lab.addresses[0])
        argv = self.lab.command(0, [sys.executable, str(HERE / "_directory_main.py")])
        proc = subprocess.Popen(argv, env=self._env(transport), stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        address = proc.stdout.readline().strip()
        if not address.startswith("tcp://"):
            raise RuntimeError(f"the directory in {self.lab.nodes[0]} did not start (exit {proc.poll()})")
        self.directory_address = address
        self.dc = DirectoryClient(address, self.driver_transport)

    def spawn_host(self, name: str, node: int, transport: TransportConfig | None = None) -> HostProcess:
        """``python -m asyncflow.core.host`` inside ``node``'s namespace (what spawn_host runs, prefixed)."""
        transport = transport or self.transport(self.lab.addresses[node])
        argv = self.lab.command(
            node, [sys.executable, "-m", "asyncflow.core.host", "--name", name, "--directory", self.directory_address]
        )
        self.dc.unregister(f"host.{name}")  # as spawn_host: never look up a predecessor of the same name
        host = HostProcess(name, subprocess.Popen(argv, env=self._env(transport)), self.dc)
        self.hosts[name] = host
        return host

    def start(self, host: str, name: str, cls: str, **kwargs) -> protocol.ActorEntry:
        spec = protocol.ActorSpec(name=name, cls=cls, kwargs=msgspec.msgpack.encode(kwargs))
        return self.hosts[host].start([spec], timeout_s=30)[0]

    def stop(self) -> None:
        for host in self.hosts.values():
            if host.alive():
                host.proc.terminate()  # SIGTERM: the host stops its actors (the directory may be cut off)
        for host in self.hosts.values():
            try:
                host.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                host.kill()
        for proc in self.procs:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def lab():
    why = _lab.unavailable()
    if why:
        pytest.skip(why)
    _lab.remove_stale_labs()
    made = _lab.Lab(num_nodes=4)
    yield made
    made.destroy()


@pytest.fixture
def cluster(lab):
    made = Cluster(lab)
    try:
        made.start_directory()
        yield made
    finally:
        for node in range(len(lab.nodes)):
            lab.restore(node)  # first: stopping hosts unregister them from the directory
        made.stop()
