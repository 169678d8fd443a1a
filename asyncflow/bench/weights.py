"""``afctl bench weights``: one weight version from the ``weights`` actor (in its own
process host, as in the trainer's process) to a replica (this process), over the
two transports side by side: nng chunks (GetWeightChunk, the default) and the
collective channel (gloo on cpu; StreamWeights + one broadcast per chunk). Each
fetch is the whole path a replica takes, up to host tensors ready to load (the
weights actor runs the collective transport, whose sender also serves nng chunks)."""

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


@click.command()
@click.option("--mb", default=50, show_default=True, help="Size of the weight set (MB, float32 tensors).")
@click.option("--tensor-mb", default=4.0, show_default=True, help="Size of each tensor (MB).")
@click.option("--chunk-mb", default=32, show_default=True, help="Chunk size of both transports (MB; weights' default).")
@click.option("--scheme", default="ipc", type=click.Choice(["ipc", "tcp"]), show_default=True, help="nng transport.")
@click.option("--repeats", default=5, show_default=True, help="Fetches per transport (median reported).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def weights(mb: int, tensor_mb: float, chunk_mb: int, scheme: str, repeats: int, as_json: bool) -> None:
    """Weight fetch bytes/s: nng chunks vs the gloo collective, one run, side by side."""
    import tempfile

    import msgspec
    import torch

    from asyncflow.actors.weights.collective import CollectiveReceiver
    from asyncflow.actors.weights.nng import NngReceiver
    from asyncflow.config.names import WEIGHTS
    from asyncflow.core import protocol
    from asyncflow.core.directory import DirectoryClient, start_directory
    from asyncflow.core.host import spawn_host
    from asyncflow.core.transport import TransportConfig

    transport = TransportConfig(scheme=scheme, secret="bench", ipc_dir=tempfile.mkdtemp(prefix="af-bench-"))
    directory = start_directory(transport)
    client = DirectoryClient(directory.address, transport)
    kwargs = dict(
        run_dir=bench_run_dir(tempfile.mkdtemp(prefix="af-bench-run-")),
        num_bytes=mb << 20,
        tensor_bytes=int(tensor_mb * (1 << 20)),
        chunk_bytes=chunk_mb << 20,
    )
    host = spawn_host(
        "bench-weights",
        client,
        transport,
        [protocol.ActorSpec(name=WEIGHTS, cls=f"{__name__}:BenchWeights", kwargs=msgspec.msgpack.encode(kwargs))],
    )
    rows: list[dict[str, Any]] = []
    try:
        ref = client.ref(WEIGHTS)
        receiver = CollectiveReceiver(client, transport, "bench.0", torch.device("cpu"))
        fetchers = {"nng": lambda: NngReceiver(120.0).fetch(ref), f"collective ({receiver.backend})": lambda: receiver.fetch(ref)}
        for name, fetch in fetchers.items():
            fetch()  # warm up: connections, the collective's group, the layout
            times, num_bytes = [], 0
            for _ in range(repeats):
                t0 = time.perf_counter()
                _, tensors = fetch()
                times.append(time.perf_counter() - t0)
                num_bytes = sum(t.numel() * t.element_size() for _, t in tensors)
            median = statistics.median(times)
            rows.append(
                {
                    "transport": name,
                    "scheme": scheme,
                    "bytes": num_bytes,
                    "tensors": len(tensors),
                    "fetch_s": round(median, 4),
                    "gb_per_s": round(num_bytes / median / 1e9, 3),
                }
            )
        receiver.close()
    finally:
        host.stop()
        directory.stop()
    click.echo(f"{'transport':<20} {'nng':<5} {'MB':>7} {'tensors':>8} {'fetch s':>8} {'GB/s':>7}")
    for r in rows:
        click.echo(
            f"{r['transport']:<20} {r['scheme']:<5} {r['bytes'] / 1e6:>7.1f} {r['tensors']:>8} "
            f"{r['fetch_s']:>8} {r['gb_per_s']:>7}"
        )
    if len(rows) == 2:
        click.echo(f"collective / nng: {rows[1]['gb_per_s'] / max(rows[0]['gb_per_s'], 1e-9):.2f}x")
    if as_json:
        click.echo(json.dumps({"rows": rows}))
