"""Process hosts placed by Ray (``[cluster] launcher = "ray"``).

Ray only places processes; the actors keep talking over nng on TCP. For each
process host the driver

1. reserves a placement group of one bundle: the host's devices by Ray's resource
   name (``GPU`` for cuda, ``NPU`` for Ascend: Ray sets CUDA_VISIBLE_DEVICES /
   ASCEND_RT_VISIBLE_DEVICES of the process), else a fraction of a CPU
   (``CPU_PER_HOST``: a light process must not wait for a whole core);
2. starts a small Ray actor (``_HostRunner``) in that bundle, which spawns
   ``python -m asyncflow.core.host`` with the transport bound to its node's IP
   (or advertised there when ``bind_host`` is a wildcard) and the cluster secret;
   the host dies with the Ray actor (PR_SET_PDEATHSIG);
3. waits for ``host.<name>`` in the directory and watches it with a heartbeat,
   so that a lost node is reported by the host's name within seconds.

``RayHosts.spawn`` has the signature of :func:`asyncflow.core.host.spawn_host`, and
returns a :class:`RayHost` that answers what the launcher asks of a local
``HostProcess`` (alive, stop, kill, pid, dump_stacks). Ray is imported only here:
``pip install -e '.[ray]' (in the asyncflow checkout)``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import click
import msgspec

from asyncflow.actors._heartbeat import Heartbeat
from asyncflow.config.cluster import ClusterConfig
from asyncflow.config.load import ConfigError
from asyncflow.core import protocol
from asyncflow.core.directory import DirectoryClient
from asyncflow.core.errors import ActorTimeout
from asyncflow.core.host import PARENT_ENV, HostProcess
from asyncflow.core.transport import _WILDCARD, TRANSPORT_ENV, TransportConfig

CPU_PER_HOST = 0.1
"""CPU a host without devices reserves from Ray (its threads are set by threads_per_process)."""
DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")
RAY_RESOURCE = {"cuda": "GPU", "npu": "NPU"}


def _ray():
    try:
        import ray
    except ModuleNotFoundError:
        raise ConfigError("[cluster] launcher = 'ray' needs Ray: pip install -e '.[ray]' (in the asyncflow checkout)") from None
    return ray


def node_transport(transport: TransportConfig, node_ip: str) -> TransportConfig:
    """The transport of a process on the node ``node_ip``: bound there, or advertised
    there when ``bind_host`` is a wildcard (listen on every interface)."""
    if transport.bind_host in _WILDCARD:
        return msgspec.structs.replace(transport, advertise_host=node_ip)
    return msgspec.structs.replace(transport, bind_host=node_ip, advertise_host="")


class _HostRunner:
    """The Ray actor that owns one process host (its child process)."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None

    def start(self, name: str, directory_address: str, transport_json: str, env: dict[str, str]) -> tuple[str, int]:
        import ray

        node_ip = ray.util.get_node_ip_address()
        transport = node_transport(msgspec.json.decode(transport_json, type=TransportConfig), node_ip)
        child_env = {**os.environ, **{k: v for k, v in env.items() if k not in DEVICE_VARS}}  # Ray set the devices
        child_env[TRANSPORT_ENV] = transport.to_env()
        child_env[PARENT_ENV] = str(os.getpid())
        cmd = [sys.executable, "-m", "asyncflow.core.host", "--name", name, "--directory", directory_address]
        self.proc = subprocess.Popen(cmd, env=child_env)
        return node_ip, self.proc.pid

    def wait_exit(self) -> int:
        assert self.proc is not None, "start() first"
        return self.proc.wait()

    def send_signal(self, sig: int) -> None:
        assert self.proc is not None, "start() first"
        if self.proc.poll() is None:
            self.proc.send_signal(sig)


class RayHost(HostProcess):
    """Driver-side handle of a process host running under a Ray actor."""

    def __init__(self, name: str, directory: DirectoryClient, runner, group, hosts: RayHosts):
        super().__init__(name, proc=None, directory=directory)  # type: ignore[arg-type]  # its process is on its node: every use of proc is overridden here
        self._runner = runner
        self._group = group
        self._hosts = hosts
        self.node_ip, self._pid = "", 0
        self._exit_ref = None
        self._reported = False

    @property
    def pid(self) -> int:
        return self._pid  # on node ``node_ip``: never signal it from the driver

    @property
    def returncode(self) -> int | None:
        if self._exit_ref is None or not self._exited():
            return None if self.name not in self._hosts.watcher.lost() else -1
        ray = _ray()
        try:
            return ray.get(self._exit_ref, timeout=5)
        except ray.exceptions.RayError:  # the Ray actor or its node died: no exit code to tell
            return -1

    def _exited(self) -> bool:
        ready, _ = _ray().wait([self._exit_ref], timeout=0)
        return bool(ready)

    def alive(self) -> bool:
        if self._exit_ref is not None and self._exited():
            return False
        lost = self._hosts.watcher.lost().get(self.name)
        if lost and not self._reported:
            click.echo(f"!! {lost} (node {self.node_ip})", err=True)
            self._reported = True
        return lost is None

    def dump_stacks(self) -> None:
        """The host appends its stacks to its RUN_DIR/logs/<name>.stacks.txt on its node (the driver's
        stall report reads it where the run directory is shared; ``core.host.collect_stacks``)."""
        self._runner.send_signal.remote(signal.SIGUSR1)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.alive():
            try:
                self._directory.ref(self.actor_name, wait_s=0.5).ask(protocol.Stop(), timeout_s=timeout_s)
                _ray().wait([self._exit_ref], timeout=timeout_s)
            except (ActorTimeout, LookupError) as exc:
                click.echo(f"host {self.name} did not stop on request ({exc}); terminating", err=True)
        self.kill()

    def kill(self) -> None:
        ray = _ray()
        self._hosts.watcher.forget(self.name)
        ray.kill(self._runner)  # its host child gets SIGTERM (PR_SET_PDEATHSIG)
        ray.util.remove_placement_group(self._group)


class RayHosts:
    """Places the run's process hosts on a Ray cluster; ``spawn`` replaces ``spawn_host``."""

    def __init__(self, cluster: ClusterConfig, num_devices: Callable[[str], int], place_timeout_s: float = 300.0):
        self.cluster = cluster
        self.num_devices = num_devices  # host name -> devices it uses (the supervisor's: its role's RoleSpec)
        self.place_timeout_s = place_timeout_s
        self.heartbeat: Heartbeat | None = None  # started by start()
        self.handles: dict[str, RayHost] = {}  # the latest handle of each host name

    @property
    def watcher(self) -> Heartbeat:
        """The heartbeat that watches every host (started by ``start``)."""
        assert self.heartbeat is not None, "RayHosts.start() first"
        return self.heartbeat

    def connect(self, transport: TransportConfig) -> TransportConfig:
        """Join the Ray cluster; returns the driver's transport, reachable from every node."""
        if transport.scheme != "tcp":
            raise ConfigError(
                f"[cluster] launcher = 'ray' needs [cluster.transport] scheme = 'tcp' "
                f"(got {transport.scheme!r}): actors on other nodes dial each other over tcp"
            )
        if not transport.secret_bytes():
            raise ConfigError(
                "[cluster] launcher = 'ray' needs a cluster secret: export ASYNCFLOW_SECRET=<random> "
                "on the driver, or set [cluster.transport] secret"
            )
        ray = _ray()
        address = self.cluster.ray_address or os.environ.get("RAY_ADDRESS") or "auto"
        if not ray.is_initialized():
            try:
                ray.init(address=address, log_to_driver=True, configure_logging=False)
            except ConnectionError as exc:
                raise ConfigError(
                    f"no Ray cluster at {address!r} ({exc}): start one with `ray start --head`, "
                    f"or set [cluster] ray_address / RAY_ADDRESS"
                ) from None
        # the secret travels to the hosts in their transport (from the config or this env)
        transport = msgspec.structs.replace(transport, secret=transport.secret_bytes().decode())
        self.transport = node_transport(transport, ray.util.get_node_ip_address()).validate()
        self.heartbeat = Heartbeat(self.transport, interval_s=1.0, lost_after_s=5.0).start()
        return self.transport

    def bundle(self, host: str) -> dict[str, float]:
        """What ``host`` reserves: its devices by Ray's name, else a fraction of a CPU."""
        c, num_devices = self.cluster, self.num_devices(host)
        if c.device == "cpu" or num_devices == 0:
            return {"CPU": CPU_PER_HOST}
        return {"CPU": CPU_PER_HOST, RAY_RESOURCE[c.device]: float(num_devices)}

    def spawn(
        self,
        name: str,
        directory: DirectoryClient,
        transport: TransportConfig,
        specs: list[protocol.ActorSpec] | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float = 120.0,
    ) -> RayHost:
        """Like ``spawn_host``, on a node Ray picks."""
        ray = _ray()
        from ray.util.placement_group import placement_group

        if name in self.handles:  # a restart: free the lost one's Ray actor and reservation first
            self.handles.pop(name).kill()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self.bundle(name)
        group = placement_group([bundle], strategy="PACK")
        ready, _ = ray.wait([group.ready()], timeout=self.place_timeout_s)
        if not ready:
            ray.util.remove_placement_group(group)
            raise ConfigError(
                f"Ray could not place process {name!r} (needs {bundle}) within {self.place_timeout_s:g} s; "
                f"free in the cluster: {ray.available_resources()}. Add nodes or devices, or lower "
                f"num_replicas / num_workers"
            )
        devices = {k: v for k, v in bundle.items() if k != "CPU"}
        runner = (
            ray.remote(_HostRunner)
            .options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
                num_cpus=bundle["CPU"],
                num_gpus=devices.get("GPU", 0),
                resources={k: v for k, v in devices.items() if k != "GPU"},
                max_concurrency=4,
            )
            .remote()
        )
        directory.unregister(f"host.{name}")  # never answer for a dead host of the same name
        host = RayHost(name, directory, runner, group, self)
        try:
            host.node_ip, host._pid = ray.get(
                runner.start.remote(name, directory.address, transport.to_env(), dict(env or {})), timeout=timeout_s
            )
            host._exit_ref = runner.wait_exit.remote()
            click.echo(f"ray: process {name} on node {host.node_ip} (pid {host.pid}, reserved {bundle})")
            entry = self._wait_registered(host, directory, timeout_s)
            self.watcher.watch(name, host.actor_name, entry.address)
            if specs:
                host.start(specs, timeout_s=timeout_s)
        except BaseException:
            host.kill()
            raise
        self.handles[name] = host
        return host

    @staticmethod
    def _wait_registered(host: RayHost, directory: DirectoryClient, timeout_s: float) -> protocol.ActorEntry:
        """The host's directory entry, once it registers; an error at once if it exits first."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return directory.lookup(host.actor_name, wait_s=1.0)
            except LookupError:
                if host._exited():
                    raise RuntimeError(
                        f"process host {host.name!r} on node {host.node_ip} exited with code {host.returncode} "
                        f"before it registered: its error is in the Ray worker's log on that node (printed here "
                        f"under '(_HostRunner pid=...)'); is asyncflow installed there, and the run directory shared?"
                    ) from None
                if time.monotonic() > deadline:
                    raise

    def close(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        ray = _ray()
        if ray.is_initialized():
            ray.shutdown()
