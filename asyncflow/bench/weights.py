"""``afctl bench weights``: one weight version from the ``weights`` actor (in its own
process host, as in the trainer's process) to a replica (this process), over the
transports side by side: nng chunks (GetWeightChunk, the default), the local
transport (the version mapped from /dev/shm; with ``--device cuda``, a CUDA IPC handle
of the trainer's GPU buffer) and the collective channel (gloo on cpu; StreamWeights +
one broadcast per chunk). Each fetch is the whole path a replica takes, up to tensors
ready to load; ``+load`` adds the copy into the replica's parameters (on ``--device``),
which is where a mapped version's pages are first read. nng and local are served by
one weights actor with the local transport (its sender also serves nng chunks), the
collective by a second one."""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import click

from asyncflow.actors.weights.actor import Publish, WeightSyncActor


class BenchWeights(WeightSyncActor):
    """A weights actor that publishes a synthetic model of ``num_bytes`` at start."""

    def __init__(self, ctx, run_dir: str, num_bytes: int, tensor_bytes: int, chunk_bytes: int):
        super().__init__(ctx, run_dir=run_dir, replicas=[], chunk_bytes=chunk_bytes)
        import torch

        g = torch.Generator().manual_seed(0)
        numel = tensor_bytes // 4
        named = [(f"layers.{i}.weight", torch.randn(numel, generator=g)) for i in range(max(1, num_bytes // tensor_bytes))]
        self.handle(Publish(1, named), None)


def bench_run_dir(path: str, substep_updates: bool = False, transport: str = "collective", device: str = "cpu") -> str:
    """A run directory that holds only what the weights actor reads: a config with
    ``transport`` (the collective's and the local sender also serve nng) on ``device``,
    and an empty launch."""
    from pathlib import Path

    import msgspec

    from asyncflow.actors.runtime.run_dir import LaunchInfo
    from asyncflow.config.cluster import ClusterConfig
    from asyncflow.config.run import RunConfig
    from asyncflow.config.workflow import WorkflowConfig

    run = Path(path)
    config = RunConfig(
        workflow=WorkflowConfig(weight_transport=transport, substep_updates=substep_updates),  # type: ignore[arg-type]
        cluster=ClusterConfig(device=device),  # type: ignore[arg-type]
    )
    (run / "config.json").write_bytes(msgspec.json.encode(config))
    (run / "launch.json").write_bytes(msgspec.json.encode(LaunchInfo(model_dir="", base_model_dir="", data_path="")))
    return str(run)


def _load(tensors: list, params: list) -> None:
    """What a replica's ``load_weights`` does with a fetched version: one copy into each parameter."""
    import torch

    for (_, t), p in zip(tensors, params):
        p.copy_(t.reshape(p.shape))
    if params and params[0].device.type == "cuda":
        torch.cuda.synchronize(params[0].device)


def _measure(name: str, scheme: str, fetch, params: list, repeats: int) -> dict[str, Any]:
    """Median seconds of ``fetch`` alone and of fetch + load, over ``repeats`` (after one warm-up)."""
    _load(fetch()[1], params)  # warm up: connections, the collective's group, the layout, the first mapping
    fetch_times, total_times, num_bytes, num_tensors = [], [], 0, 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        _, tensors = fetch()
        t1 = time.perf_counter()
        _load(tensors, params)
        total_times.append(time.perf_counter() - t0)
        fetch_times.append(t1 - t0)
        num_bytes = sum(t.numel() * t.element_size() for _, t in tensors)
        num_tensors = len(tensors)
        del tensors
    fetch_s, total_s = statistics.median(fetch_times), statistics.median(total_times)
    return {
        "transport": name,
        "scheme": scheme,
        "bytes": num_bytes,
        "tensors": num_tensors,
        "fetch_s": round(fetch_s, 4),
        "gb_per_s": round(num_bytes / fetch_s / 1e9, 3),
        "load_s": round(total_s, 4),
        "loaded_gb_per_s": round(num_bytes / total_s / 1e9, 3),
    }


@click.command()
@click.option("--mb", default=50, show_default=True, help="Size of the weight set (MB, float32 tensors; SmolLM2-135M: 540).")
@click.option("--tensor-mb", default=4.0, show_default=True, help="Size of each tensor (MB).")
@click.option("--chunk-mb", default=32, show_default=True, help="Chunk size of both transports (MB; weights' default).")
@click.option("--scheme", default="ipc", type=click.Choice(["ipc", "tcp"]), show_default=True, help="nng transport.")
@click.option("--repeats", default=5, show_default=True, help="Fetches per transport (median reported).")
@click.option(
    "--device",
    default="cpu",
    type=click.Choice(["cpu", "cuda"]),
    show_default=True,
    help="Where the replica's parameters are (and, for local, where the trainer publishes: cuda shares its GPU by CUDA IPC).",
)
@click.option(
    "--transports",
    default="nng,local,collective",
    show_default=True,
    help="Comma-separated: which transports to measure (nng, local, collective).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def weights(
    mb: int, tensor_mb: float, chunk_mb: int, scheme: str, repeats: int, device: str, transports: str, as_json: bool
) -> None:
    """Weight fetch bytes/s: nng chunks, the local transport (/dev/shm or CUDA IPC) and the
    collective, one run, side by side; each also with the copy into the replica's parameters."""
    import tempfile

    import msgspec
    import torch

    from asyncflow.actors.weights.collective import CollectiveReceiver
    from asyncflow.actors.weights.local import LocalReceiver
    from asyncflow.actors.weights.nng import NngReceiver
    from asyncflow.config.names import WEIGHTS
    from asyncflow.core import protocol
    from asyncflow.core.directory import DirectoryClient, start_directory
    from asyncflow.core.host import spawn_host
    from asyncflow.core.transport import TransportConfig

    wanted = [t.strip() for t in transports.split(",") if t.strip()]
    unknown = sorted(set(wanted) - {"nng", "local", "collective"})
    if unknown:
        raise click.BadParameter(f"unknown {unknown}: use nng, local and/or collective", param_hint="--transports")
    if device == "cuda" and "collective" in wanted:
        # the weights actor and this replica would be two NCCL ranks on one GPU, which NCCL refuses
        # (tests/runs/test_weight_collective.py measures the collective across two GPUs)
        click.echo("collective: left out with --device cuda (NCCL refuses two ranks on one GPU)")
        wanted.remove("collective")
    on = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    num_tensors, tensor_bytes = max(1, (mb << 20) // int(tensor_mb * (1 << 20))), int(tensor_mb * (1 << 20))
    params = [torch.empty(tensor_bytes // 4, device=on) for _ in range(num_tensors)]  # the replica's parameters
    transport = TransportConfig(scheme=scheme, secret="bench", ipc_dir=tempfile.mkdtemp(prefix="af-bench-"))
    directory = start_directory(transport)
    client = DirectoryClient(directory.address, transport)
    rows: list[dict[str, Any]] = []

    def host_of(run_transport: str):
        """A weights actor with ``run_transport`` in its own process, one version published."""
        kwargs = dict(
            run_dir=bench_run_dir(tempfile.mkdtemp(prefix="af-bench-run-"), transport=run_transport, device=device),
            num_bytes=mb << 20,
            tensor_bytes=tensor_bytes,
            chunk_bytes=chunk_mb << 20,
        )
        spec = protocol.ActorSpec(name=WEIGHTS, cls=f"{__name__}:BenchWeights", kwargs=msgspec.msgpack.encode(kwargs))
        return spawn_host(f"bench-weights-{run_transport}", client, transport, [spec])

    try:
        # nng and local from one weights actor (the local sender also serves nng chunks)
        if "nng" in wanted or "local" in wanted:
            host = host_of("local")
            try:
                ref = client.ref(WEIGHTS, refresh=True)
                if "nng" in wanted:
                    rows.append(_measure("nng", scheme, lambda: NngReceiver(120.0).fetch(ref), params, repeats))
                if "local" in wanted:
                    local = LocalReceiver(client, "bench.0", on)
                    kind = f"local ({'cuda ipc' if on.type == 'cuda' else 'shm'})"
                    rows.append(_measure(kind, scheme, lambda: local.fetch(ref), params, repeats))
                    if local.fallback_why:
                        raise click.ClickException(f"the local transport fell back to nng: {local.fallback_why}")
            finally:
                host.stop()
                client.unregister(WEIGHTS)
        if "collective" in wanted:
            host = host_of("collective")
            try:
                ref = client.ref(WEIGHTS, refresh=True)
                receiver = CollectiveReceiver(client, transport, "bench.0", on)
                rows.append(_measure(f"collective ({receiver.backend})", scheme, lambda: receiver.fetch(ref), params, repeats))
                receiver.close()
            finally:
                host.stop()
    finally:
        directory.stop()
    click.echo(f"{'transport':<20} {'nng':<5} {'MB':>7} {'tensors':>8} {'fetch s':>8} {'GB/s':>7} {'+load s':>8} {'GB/s':>7}")
    for r in rows:
        click.echo(
            f"{r['transport']:<20} {r['scheme']:<5} {r['bytes'] / 1e6:>7.1f} {r['tensors']:>8} "
            f"{r['fetch_s']:>8} {r['gb_per_s']:>7} {r['load_s']:>8} {r['loaded_gb_per_s']:>7}"
        )
    base = next((r for r in rows if r["transport"] == "nng"), None)
    for r in rows:
        if base is not None and r is not base:
            click.echo(
                f"{r['transport']} / nng: {r['gb_per_s'] / max(base['gb_per_s'], 1e-9):.2f}x fetched, "
                f"{r['loaded_gb_per_s'] / max(base['loaded_gb_per_s'], 1e-9):.2f}x loaded"
            )
    if as_json:
        click.echo(json.dumps({"rows": rows}))
