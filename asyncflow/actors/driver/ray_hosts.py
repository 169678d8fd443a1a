"""Process hosts placed by Ray (``[cluster] launcher = "ray"``).

Ray only places processes; the actors keep talking over nng on TCP. For each
process host the driver

1. reserves a placement group of one bundle: the host's devices by Ray's resource
   name (``GPU`` for cuda, ``NPU`` for Ascend: Ray sets CUDA_VISIBLE_DEVICES /
   ASCEND_RT_VISIBLE_DEVICES of the process) and a fraction of a CPU
   (``[cluster] ray_cpus_per_host``: a light process must not wait for a whole core);
2. starts a small Ray actor (``_HostRunner``) in that bundle, which spawns
   ``python -m asyncflow.core.host`` with the transport bound to its node's IP
   (or advertised there when ``bind_host`` is a wildcard) and the cluster secret;
   the host dies with the Ray actor (PR_SET_PDEATHSIG);
3. waits for ``host.<name>`` in the directory and watches it with a heartbeat,
   so that a lost node is reported by the host's name within seconds.

A launch wave (``spawn_many``: every host of the run at start) does each step for all
of its hosts at once: every placement group is asked for, then one ``ray.wait`` over
all; every runner started, then one wait over all; then the registrations, awaited
together. Before anything is reserved, the run's whole need (the hosts it holds and
the wave) is compared with what the cluster declares (``capacity_error``): a run that
cannot fit fails at once in one line, not after the placement timeout. A failure
names its host, and takes the whole wave down (nothing of it stays reserved).

Loopback: when the transport binds to a loopback address, or the Ray address is one,
the driver keeps Ray on loopback (``LOOPBACK_ENV``; else Ray replaces 127.0.0.1 by the
machine's routable address, and a driver that dials it may hang there) and refuses a
cluster with a node off loopback (``loopback_error``).

``RayHosts.spawn`` has the signature of :func:`asyncflow.core.host.spawn_host`, and
returns a :class:`RayHost` that answers what the launcher asks of a local
``HostProcess`` (alive, stop, kill, pid, dump_stacks). Ray is imported only here:
``pip install -e '.[ray]' (in the asyncflow checkout)``.
"""

from __future__ import annotations

import ipaddress
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import click
import msgspec

from asyncflow.actors.driver._heartbeat import Heartbeat
from asyncflow.config.cluster import RAY_RESOURCE_STEP, ClusterConfig
from asyncflow.config.load import ConfigError
from asyncflow.core import protocol
from asyncflow.core.directory import DirectoryClient
from asyncflow.core.errors import ActorTimeout
from asyncflow.core.host import PARENT_ENV, HostProcess
from asyncflow.core.transport import _WILDCARD, TRANSPORT_ENV, TransportConfig

DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")
RAY_RESOURCE = {"cuda": "GPU", "npu": "NPU"}
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""What keeps Ray on 127.0.0.1, in the environment of the head and of the driver before Ray
is imported. Ray (2.60) turns 127.0.0.1 into the machine's routable address wherever it
meets it (``--node-ip-address``, ``_node_ip_address``, a driver's ``address``) unless
this switch, meant for one-machine clusters, is off."""


def _ray():
    try:
        import ray
    except ModuleNotFoundError:
        raise ConfigError("[cluster] launcher = 'ray' needs Ray: pip install -e '.[ray]' (in the asyncflow checkout)") from None
    return ray


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or a name) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_of(address: str) -> str:
    """The host of a Ray address (``ip:port``, ``[v6]:port``, ``ray://ip:port``)."""
    hostport = address.split("://", 1)[-1]
    return hostport.rsplit(":", 1)[0].strip("[]") if ":" in hostport else hostport


def loopback_error(bind_host: str, address: str, node_ips: Iterable[str]) -> str:
    """'' unless the transport binds to loopback while the Ray cluster (its ``address``, or
    one of its nodes) is elsewhere: then the one-line error, with the fix."""
    if not is_loopback(bind_host):
        return ""
    off = [address] if address != "auto" and not is_loopback(_host_of(address)) else []
    off += sorted({ip for ip in node_ips if not is_loopback(ip)})
    if not off:
        return ""
    return (
        f"[cluster.transport] bind_host = {bind_host!r} keeps the run on this machine's loopback, but the Ray cluster "
        f"is at {', '.join(off)}: start Ray on loopback (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head "
        f"--node-ip-address 127.0.0.1, as scripts/ray_local_e2e.sh does), or set bind_host = '0.0.0.0' for a cluster "
        f"of several machines"
    )


def _units(quantity: float) -> int:
    """A resource quantity in Ray's fixed-point units (sums of 0.1 stay exact)."""
    return round(quantity / RAY_RESOURCE_STEP)


def capacity_error(bundles: Sequence[Mapping[str, float]], cluster: Mapping[str, float], cpus_per_host: float) -> str:
    """'' if a Ray cluster that declares ``cluster`` (``ray.cluster_resources()``) can hold
    every one of ``bundles`` (the run's hosts) at once; else the one-line error, with the
    figures and the fixes. Only totals are compared: a bundle that fits no single node
    is still found by the placement's timeout."""
    need: dict[str, int] = {}
    for bundle in bundles:
        for key, quantity in bundle.items():
            need[key] = need.get(key, 0) + _units(quantity)
    have = {key: _units(cluster.get(key, 0.0)) for key in need}
    num_cpus, cpus = need.get("CPU", 0) * RAY_RESOURCE_STEP, have.get("CPU", 0) * RAY_RESOURCE_STEP
    if need.get("CPU", 0) > have.get("CPU", 0):
        fits = math.floor(cpus / len(bundles) / RAY_RESOURCE_STEP) * RAY_RESOURCE_STEP
        lower = f"lower [cluster] ray_cpus_per_host to {fits:.4g} or less, or " if fits > 0 else ""
        return (
            f"Ray cannot place the run's {len(bundles)} process hosts: each reserves [cluster] ray_cpus_per_host = "
            f"{cpus_per_host:g} CPU, {num_cpus:.4g} CPU in all, and the Ray cluster has {cpus:.4g} CPU; {lower}start "
            f"Ray with more CPUs (ray start --num-cpus {math.ceil(num_cpus - 1e-9)} or more, over all its nodes)"
        )
    short = [key for key in need if key != "CPU" and need[key] > have[key]]
    if short:
        figures = ", ".join(
            f"{need[k] * RAY_RESOURCE_STEP:g} {k} and the Ray cluster has {have[k] * RAY_RESOURCE_STEP:g} {k}" for k in short
        )
        return (
            f"Ray cannot place the run's {len(bundles)} process hosts: they reserve {figures}; add nodes or devices, "
            f"or lower num_replicas / num_workers / train.num_ranks"
        )
    return ""


def _plain(resources: Mapping[str, float]) -> dict[str, float]:
    """Ray's resources without the per-placement-group and per-node entries."""
    return {k: v for k, v in resources.items() if "_group_" not in k and not k.startswith("node:")}


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
        address = self.cluster.ray_address or os.environ.get("RAY_ADDRESS") or "auto"
        error = loopback_error(transport.bind_host, address, [])
        if error:  # before Ray dials it
            raise ConfigError(error)
        if is_loopback(transport.bind_host) or (address != "auto" and is_loopback(_host_of(address))):
            self._stay_on_loopback()
        ray = _ray()
        if not ray.is_initialized():
            try:
                ray.init(address=address, log_to_driver=True, configure_logging=False)
            except ConnectionError as exc:
                raise ConfigError(
                    f"no Ray cluster at {address!r} ({exc}): start one with `ray start --head`, "
                    f"or set [cluster] ray_address / RAY_ADDRESS"
                ) from None
        error = loopback_error(transport.bind_host, address, [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]])
        if error:
            ray.shutdown()
            raise ConfigError(error)
        # the secret travels to the hosts in their transport (from the config or this env)
        transport = msgspec.structs.replace(transport, secret=transport.secret_bytes().decode())
        self.transport = node_transport(transport, ray.util.get_node_ip_address()).validate()
        self.heartbeat = Heartbeat(self.transport, interval_s=1.0, lost_after_s=5.0).start()
        return self.transport

    @staticmethod
    def _stay_on_loopback() -> None:
        """Ray on 127.0.0.1 in this driver (``LOOPBACK_ENV``): set before Ray is imported."""
        if all(os.environ.get(k) == v for k, v in LOOPBACK_ENV.items()):
            return
        if "ray" in sys.modules:
            raise ConfigError(
                "a loopback Ray cluster needs RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray is imported (Ray was "
                "imported already): export it before afctl up"
            )
        os.environ.update(LOOPBACK_ENV)

    def bundle(self, host: str) -> dict[str, float]:
        """What ``host`` reserves: ``ray_cpus_per_host`` of a CPU, and its devices by Ray's name."""
        c, num_devices = self.cluster, self.num_devices(host)
        if c.device == "cpu" or num_devices == 0:
            return {"CPU": c.ray_cpus_per_host}
        return {"CPU": c.ray_cpus_per_host, RAY_RESOURCE[c.device]: float(num_devices)}

    def spawn(
        self,
        name: str,
        directory: DirectoryClient,
        transport: TransportConfig,
        specs: list[protocol.ActorSpec] | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float = 120.0,
    ) -> RayHost:
        """Like ``spawn_host``, on a node Ray picks (a wave of one host)."""
        host = self.spawn_many(directory, transport, {name: dict(env or {})}, timeout_s)[name]
        if specs:
            try:
                host.start(specs, timeout_s=timeout_s)
            except BaseException:
                self.handles.pop(name, None)
                host.kill()
                raise
        return host

    def spawn_many(
        self, directory: DirectoryClient, transport: TransportConfig, envs: dict[str, dict[str, str]], timeout_s: float = 120.0
    ) -> dict[str, RayHost]:
        """Start the hosts named in ``envs`` (name -> its environment) at once, each on a node
        Ray picks; returns once every one registered. Raises ConfigError when the cluster
        cannot hold the run (before anything is reserved) or a host cannot be placed, and
        RuntimeError naming each host that failed to start; nothing of the wave is left."""
        ray = _ray()
        from ray.util.placement_group import placement_group

        for name in envs:  # a restart: free the lost one's Ray actor and reservation first
            if name in self.handles:
                self.handles.pop(name).kill()
        bundles = {name: self.bundle(name) for name in envs}
        held = [self.bundle(name) for name in self.handles]
        error = capacity_error(held + list(bundles.values()), ray.cluster_resources(), self.cluster.ray_cpus_per_host)
        if error:
            raise ConfigError(error)
        groups = {name: placement_group([bundle], strategy="PACK") for name, bundle in bundles.items()}
        hosts: dict[str, RayHost] = {}
        try:
            self._wait_placed(groups, bundles)
            for name, group in groups.items():
                directory.unregister(f"host.{name}")  # never answer for a dead host of the same name
                hosts[name] = RayHost(name, directory, self._runner(group, bundles[name]), group, self)
            self._start_runners(hosts, directory, transport, {n: (envs[n], bundles[n]) for n in hosts}, timeout_s)
            self._await_registered(hosts, directory, timeout_s)
        except BaseException:
            for name, group in groups.items():
                if name in hosts:
                    hosts[name].kill()
                else:
                    ray.util.remove_placement_group(group)
            raise
        self.handles.update(hosts)
        return hosts

    def _wait_placed(self, groups: dict, bundles: dict[str, dict[str, float]]) -> None:
        """One wait over every placement group of the wave; ConfigError names those not placed."""
        ray = _ray()
        ready_refs = {name: group.ready() for name, group in groups.items()}
        _, pending = ray.wait(list(ready_refs.values()), num_returns=len(ready_refs), timeout=self.place_timeout_s)
        if pending:
            late = [name for name, ref in ready_refs.items() if ref in pending]
            raise ConfigError(
                f"Ray could not place {len(late)} of {len(groups)} processes within {self.place_timeout_s:g} s "
                f"({', '.join(late[:5])}{', ...' if len(late) > 5 else ''}; each needs {bundles[late[0]]}); free in the "
                f"cluster: {_plain(ray.available_resources())}. Add nodes or devices, or lower num_replicas / num_workers"
            )

    @staticmethod
    def _runner(group, bundle: dict[str, float]):
        """The Ray actor that will own one host, in its placement group."""
        ray = _ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        devices = {k: v for k, v in bundle.items() if k != "CPU"}
        return (
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

    @staticmethod
    def _start_runners(
        hosts: dict[str, RayHost],
        directory: DirectoryClient,
        transport: TransportConfig,
        starts: dict[str, tuple[dict[str, str], dict[str, float]]],
        timeout_s: float,
    ) -> None:
        """Every runner starts its host (``starts``: name -> its environment and bundle), all
        at once, in one wait; RuntimeError names those that could not."""
        ray = _ray()
        refs = {
            name: host._runner.start.remote(name, directory.address, transport.to_env(), starts[name][0])
            for name, host in hosts.items()
        }
        _, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        failed = {name: f"not started within {timeout_s:g} s" for name, ref in refs.items() if ref in pending}
        for name, ref in refs.items():
            if name in failed:
                continue
            host = hosts[name]
            try:
                host.node_ip, host._pid = ray.get(ref)
            except ray.exceptions.RayError as exc:
                failed[name] = str(exc).strip().splitlines()[-1]
                continue
            host._exit_ref = host._runner.wait_exit.remote()
            click.echo(f"ray: process {name} on node {host.node_ip} (pid {host.pid}, reserved {starts[name][1]})")
        if failed:
            raise RuntimeError(
                "Ray could not start process hosts: " + "; ".join(f"{name!r}: {why}" for name, why in failed.items())
            )

    def _await_registered(self, hosts: dict[str, RayHost], directory: DirectoryClient, timeout_s: float) -> None:
        """Every host's registration, awaited together; then each is watched. The first
        failure (a host that exited first: named) is raised once all are known."""
        with ThreadPoolExecutor(max_workers=min(64, len(hosts))) as pool:
            futures = {name: pool.submit(self._wait_registered, host, directory, timeout_s) for name, host in hosts.items()}
        for future in futures.values():
            future.result()  # raises the first failure
        for name, future in futures.items():
            self.watcher.watch(name, hosts[name].actor_name, future.result().address)

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
