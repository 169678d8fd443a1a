"""``afctl bench fanout``: how one weight version reaches n replicas, direct vs the relay
tree (``[workflow] weight_fanout``), side by side: the bytes the trainer's ``weights``
actor serves per version and the time from the publish to the last replica holding it.

The path is the real one: the ``weights`` actor (in this process, as in the trainer's)
publishes and announces each version to the replicas the ``roster`` names; each
replica is a ``FanoutReplica``, which runs a rollout replica's weight path, a
``WeightInbox`` with the receiver ``build_receiver`` gives for the fan-out (and, for
the tree, the relay beside it), fetching over real nng sockets, then the swap and its
digest check. Only the engine is light: ``HeldWeights`` keeps the tensors it is given.
Many replicas share a process (``--processes`` of them), so 128 fit on a small box.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import threading
import time
import zlib
from typing import Any

import click

from asyncflow.actors.rollout.inbox import WeightInbox
from asyncflow.actors.runtime import messages
from asyncflow.actors.weights import build_receiver
from asyncflow.config.names import WEIGHTS
from asyncflow.core import protocol
from asyncflow.core.actor import DEFER, Actor
from asyncflow.engines.digest import weights_digest


def tensors_crc32(named_tensors) -> int:
    """crc32 of the names and raw bytes of ``named_tensors``, in order (a byte-exact check)."""
    import torch

    crc = 0
    for name, t in named_tensors:
        crc = zlib.crc32(name.encode(), crc)
        crc = zlib.crc32(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy(), crc)
    return crc


class HeldWeights:
    """What a ``WeightInbox`` uses of a rollout engine (``version``, ``load_weights``,
    ``weights_digest``), keeping the tensors as loaded: no model, no device."""

    def __init__(self) -> None:
        self.version = 0
        self.tensors: list = []

    def load_weights(self, named_tensors, version: int) -> None:
        self.tensors, self.version = list(named_tensors), version

    def weights_digest(self) -> int:
        return weights_digest(self.tensors)


class FanoutReplica(Actor):
    """A light rollout replica: WeightsReady -> its ``WeightInbox`` fetches with the
    fan-out's receiver -> a thread swaps each staged version in (digest checked) and
    records when. Takes WeightsReady (urgent), GetFanoutRecord, Ping, Stop."""

    Inbox = messages.FanoutReplicaIn
    Urgent = (messages.WeightsReady,)

    def __init__(self, ctx, fanout: str = "direct", timeout_s: float = 30.0, check_bytes: bool = False, link_mb_s: float = 0.0):
        super().__init__(ctx)
        self.engine = HeldWeights()
        self.receiver = build_receiver("nng", ctx, timeout_s, fanout=fanout, link_mb_s=link_mb_s)
        self.inbox = WeightInbox(
            ctx.name,
            self.engine,
            threading.Lock(),
            self.receiver,
            lambda: ctx.ref(WEIGHTS),
            staleness=0,  # no swap grant: each replica swaps as soon as it has the version
            verify=True,
            dtype=None,
            timeout_s=timeout_s,
            activity=lambda name: contextlib.nullcontext(),
        )
        self.check_bytes = check_bytes
        self._lock = threading.Lock()
        self._held = 0  # the newest version swapped in and recorded (the engine's, once recorded)
        self._swapped: dict[int, float] = {}
        self._crc: dict[int, int] = {}
        self._errors: list[str] = []
        self._waiting: list[tuple[int, Any]] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._swap_loop, name=f"{ctx.name}-swap", daemon=True)
        self._thread.start()

    def handle_urgent(self, msg):
        self.inbox.announce(msg)
        return protocol.Ok()

    def handle(self, msg, pending):
        match msg:
            case messages.GetFanoutRecord(version=version):
                with self._lock:
                    if pending is not None and version > self._held:
                        self._waiting.append((version, pending))
                        return DEFER
                return self._record()
            case protocol.Stop():
                return protocol.Ok()
            case _:
                raise TypeError(f"{self.ctx.name} does not handle {type(msg).__name__}")

    def _swap_loop(self) -> None:
        while not self._stopping.is_set():
            if self.inbox.wanted > self.engine.version:  # as a replica's swap_to does: a failed fetch is started again
                self.inbox.want(self.inbox.wanted)
            self.inbox.wait_fetched(0.2)
            try:
                swapped = self.inbox.swap_staged()
            except Exception as exc:  # a digest mismatch: recorded (the tests read it), the replica goes on
                with self._lock:
                    self._errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if not swapped:
                continue
            now, version = time.time(), self.engine.version
            crc = tensors_crc32(self.engine.tensors) if self.check_bytes else 0
            with self._lock:
                self._swapped[version], self._crc[version], self._held = now, crc, version
                ready = [p for want, p in self._waiting if want <= version]
                self._waiting = [(want, p) for want, p in self._waiting if want > version]
            if ready:
                record = self._record()
                for waiting in ready:
                    if not waiting.done:
                        waiting.resolve(record)

    def _record(self) -> messages.FanoutRecord:
        counters = self.receiver.counters()  # the relay tree's byte counts (none with direct fan-out)
        with self._lock:
            return messages.FanoutRecord(
                name=self.ctx.name,
                version=self._held,
                swapped_at_s=dict(self._swapped),
                crc32=dict(self._crc),
                num_bytes_from_root=int(counters.get("weights/bytes_from_root", 0)),
                num_bytes_relayed=int(counters.get("weights/bytes_relayed", 0)),
                num_relay_bytes_served=int(counters.get("weights/relay_bytes_served", 0)),
                num_fallbacks=int(counters.get("weights/relay_fallbacks", 0)),
                errors=list(self._errors),
            )

    def on_stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self.inbox.close()


def fanout_run_dir(path: str, fanout: str, degree: int = 2, timeout_s: float = 30.0, link_mb_s: float = 0.0) -> str:
    """A run directory with what the ``weights`` actor reads: the fan-out, nng, no grant, and
    ``link_mb_s``, every sender's emulated uplink (``workflow.weight_link_mb_s``; 0: none)."""
    from pathlib import Path

    import msgspec

    from asyncflow.actors.runtime.run_dir import LaunchInfo
    from asyncflow.config.run import RunConfig
    from asyncflow.config.workflow import WorkflowConfig

    run = Path(path)
    keys = {"weight_fanout": fanout, "weight_fanout_degree": degree, "substep_updates": False, "weight_timeout_s": timeout_s}
    keys["weight_link_mb_s"] = link_mb_s
    workflow = msgspec.convert(keys, WorkflowConfig)  # checked as a config file's [workflow] is
    (run / "config.json").write_bytes(msgspec.json.encode(RunConfig(workflow=workflow)))
    (run / "launch.json").write_bytes(msgspec.json.encode(LaunchInfo(model_dir="", base_model_dir="", data_path="")))
    return str(run)


def version_tensors(version: int, num_bytes: int, tensor_bytes: int) -> list:
    """A synthetic float32 weight set of about ``num_bytes``, different in every version."""
    import torch

    g = torch.Generator().manual_seed(version)
    numel = max(1, tensor_bytes // 4)
    return [(f"layers.{i}.weight", torch.randn(numel, generator=g)) for i in range(max(1, num_bytes // tensor_bytes))]


class Fleet:
    """A roster, a ``weights`` actor (this process) and ``n`` FanoutReplicas over
    ``processes`` process hosts, on one directory; ``publish`` times one version."""

    def __init__(
        self,
        client,
        transport,
        run_dir: str,
        fanout: str,
        n: int,
        processes: int,
        chunk_bytes: int,
        timeout_s: float,
        external: tuple[str, ...] = (),
        check_bytes: bool = False,
    ):
        """``external``: replicas of the roster the caller starts itself (tests: one in a
        process of its own, to kill); ``check_bytes``: replicas record a crc32 per version.
        The run directory's ``workflow.weight_link_mb_s`` paces every sender (``fanout_run_dir``)."""
        from asyncflow.actors.driver.roster import RosterActor
        from asyncflow.actors.runtime.run_dir import Run
        from asyncflow.actors.weights.actor import WeightSyncActor
        from asyncflow.config.names import ROSTER
        from asyncflow.core.actor import serve_actor
        from asyncflow.core.host import actor_spec, spawn_host

        self.client = client
        self.names = [f"rollout.{i}" for i in range(n)]
        self.served = []
        self.hosts = []
        try:
            for name, cls, kwargs in (
                (ROSTER, RosterActor, {"replicas": lambda: list(self.names)}),
                (WEIGHTS, WeightSyncActor, {"run_dir": run_dir, "replicas": self.names, "chunk_bytes": chunk_bytes}),
            ):
                served = serve_actor(cls, name, transport, directory_address=client.address, **kwargs)
                self.served.append(served)
                client.register(served.entry())
            self.weights = self.served[-1]
            hosted = [name for name in self.names if name not in external]
            link_mb_s = Run(run_dir).config.workflow.weight_link_mb_s  # each replica's relay, as the weights actor
            for p in range(min(processes, len(hosted))):  # interleaved: parents and children in different processes
                specs = [
                    actor_spec(
                        name, FanoutReplica, fanout=fanout, timeout_s=timeout_s, check_bytes=check_bytes, link_mb_s=link_mb_s
                    )
                    for name in hosted[p::processes]
                ]
                self.hosts.append(spawn_host(f"fanout-{p}", client, transport, specs))
        except BaseException:
            self.close()
            raise

    def publish(self, version: int, named: list, wait_s: float = 300.0, among: list[str] | None = None) -> dict[str, Any]:
        """Publish ``version`` and wait until every replica (of ``among``) holds it: the
        trainer's bytes served for it, the time to the last replica, and the replicas' records."""
        weights = self.client.ref(WEIGHTS)
        before = weights.ask(messages.GetWeightSyncStats())
        digest = weights_digest(named)
        t0, cpu0 = time.time(), time.process_time()
        self.weights.pykka_ref.ask(_publish(version, named, digest))
        records = [
            self.client.ref(name, refresh=True).ask(messages.GetFanoutRecord(version=version), timeout_s=wait_s)
            for name in (self.names if among is None else among)
        ]
        after = weights.ask(messages.GetWeightSyncStats())
        return {
            "served_bytes": after.num_bytes_served - before.num_bytes_served,
            # this process: the weights actor serving, as in the trainer's (and the waits on the records)
            "trainer_cpu_s": time.process_time() - cpu0,
            "last_s": max(r.swapped_at_s[version] for r in records if version in r.swapped_at_s) - t0,
            "records": records,
        }

    def records(self, among: list[str] | None = None) -> list[messages.FanoutRecord]:
        """Every replica's record now."""
        return [self.client.ref(name, refresh=True).ask(messages.GetFanoutRecord()) for name in among or self.names]

    def close(self) -> None:
        from asyncflow.core.ref import close_sockets

        # this process's sockets to the replicas, closed while they still listen (a dialer to a
        # dead address can hold nng_close for seconds: core/_nngio.py CLOSE_WAIT_S)
        addresses = set()
        for name in self.names:
            with contextlib.suppress(LookupError):
                addresses.add(self.client.lookup(name).address)
        close_sockets(addresses.__contains__)
        for host in self.hosts:
            host.stop()
        for served in reversed(self.served):
            with contextlib.suppress(Exception):
                self.client.unregister(served.name, address=served.address, timeout_s=2.0)
            served.stop()


def _publish(version: int, named: list, digest: int):
    from asyncflow.actors.weights.actor import Publish

    return Publish(version, named, digest)


@click.command()
@click.option("--replicas", default="2,8,32,128", show_default=True, help="Replica counts, comma-separated.")
@click.option("--modes", default="direct,tree", show_default=True, help="Fan-out modes, comma-separated.")
@click.option("--degree", default=2, show_default=True, help="Children per node of the tree.")
@click.option("--mb", default=16, show_default=True, help="Size of a version (MB, float32 tensors).")
@click.option("--tensor-mb", default=2.0, show_default=True, help="Size of each tensor (MB).")
@click.option("--chunk-mb", default=1.0, show_default=True, help="Chunk size (MB): the pipeline's grain.")
@click.option("--versions", default=3, show_default=True, help="Timed versions per point (after one warm-up; median).")
@click.option("--processes", default=2, show_default=True, help="Processes the replicas share.")
@click.option("--scheme", default="ipc", type=click.Choice(["ipc", "tcp"]), show_default=True, help="nng transport.")
@click.option(
    "--link-mb-s",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Emulate an uplink of this many MB/s at every sender (the trainer's weights actor, each relay), as when each "
    "replica has a host of its own; 0: none (this box's cores and memory set the time).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def fanout(
    replicas: str,
    modes: str,
    degree: int,
    mb: int,
    tensor_mb: float,
    chunk_mb: float,
    versions: int,
    processes: int,
    scheme: str,
    link_mb_s: float,
    as_json: bool,
) -> None:
    """Weight fan-out: trainer bytes per version and time to the last replica, direct vs tree."""
    import tempfile

    from asyncflow.core.directory import DirectoryClient, start_directory
    from asyncflow.core.transport import TransportConfig

    transport = TransportConfig(scheme=scheme, secret="bench", ipc_dir=tempfile.mkdtemp(prefix="af-fanout-"))
    directory = start_directory(transport)
    client = DirectoryClient(directory.address, transport)
    num_bytes, tensor_bytes, chunk_bytes = mb << 20, int(tensor_mb * (1 << 20)), int(chunk_mb * (1 << 20))
    rows: list[dict[str, Any]] = []
    try:
        for n in [int(x) for x in replicas.split(",")]:
            for mode in modes.split(","):
                run_dir = fanout_run_dir(tempfile.mkdtemp(prefix="af-fanout-run-"), mode, degree, link_mb_s=link_mb_s)
                fleet = Fleet(client, transport, run_dir, mode, n, processes, chunk_bytes, timeout_s=60.0)
                try:
                    points = [fleet.publish(v, version_tensors(v, num_bytes, tensor_bytes)) for v in range(1, versions + 2)][1:]
                finally:
                    fleet.close()
                size = sum(t.numel() * 4 for _, t in version_tensors(0, num_bytes, tensor_bytes))
                served = statistics.median(p["served_bytes"] for p in points)
                errors = [e for p in points for r in p["records"] for e in r.errors]
                rows.append(
                    {
                        "replicas": n,
                        "fanout": mode,
                        "link_mb_s": link_mb_s,
                        "degree": degree if mode == "tree" else None,
                        "version_bytes": size,
                        "trainer_bytes_per_version": served,
                        "trainer_copies_per_version": round(served / size, 2),
                        "last_replica_s": round(statistics.median(p["last_s"] for p in points), 3),
                        "trainer_cpu_s": round(statistics.median(p["trainer_cpu_s"] for p in points), 3),
                        "fallbacks": sum(r.num_fallbacks for r in points[-1]["records"]),
                        "errors": errors[:3],
                    }
                )
                r = rows[-1]
                click.echo(
                    f"{n:>4} replicas {mode:<6}: trainer served {served / 1e6:8.1f} MB/version "
                    f"({r['trainer_copies_per_version']:g} copies, {r['trainer_cpu_s']:.2f} CPU-s), "
                    f"last replica after {r['last_replica_s']:.3f} s",
                    err=True,
                )
    finally:
        directory.stop()
    click.echo(
        f"{'replicas':>8} {'fanout':<10} {'MB/version':>10} {'trainer MB':>11} {'copies':>7} {'trainer CPU-s':>13} {'last s':>8}"
    )
    for r in rows:
        label = r["fanout"] + (f" d={r['degree']}" if r["degree"] else "")
        click.echo(
            f"{r['replicas']:>8} {label:<10} {r['version_bytes'] / 1e6:>10.1f} {r['trainer_bytes_per_version'] / 1e6:>11.1f} "
            f"{r['trainer_copies_per_version']:>7g} {r['trainer_cpu_s']:>13.2f} {r['last_replica_s']:>8.3f}"
        )
    if any(r["errors"] for r in rows):
        click.echo(f"errors: {[r['errors'] for r in rows if r['errors']]}")
    if as_json:
        click.echo(json.dumps({"rows": rows}))
