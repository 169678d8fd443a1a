"""``afctl bench transport``: nng request/reply round trip and bandwidth, raw pynng
next to the asyncflow runtime (frames + pykka actor), so the runtime's own
overhead is visible. The server runs in another process for ipc and tcp."""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import time

import click

SIZES_BYTES = [100, 6 * 1024, 4 << 20, 12_582_912]  # tiny; B=8 L=64 put; 4 MB; B=256 L=4096 put


def _raw_server(address: str, ready) -> None:
    import pynng

    with pynng.Rep0(recv_max_size=0) as sock:
        sock.listen(address)
        ready.set()
        while True:
            try:
                msg = sock.recv_msg()
            except pynng.Closed:  # the benchmark is over
                return
            sock.send_msg(msg)


def _time_calls(call, size: int, min_calls: int, min_s: float) -> list[float]:
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < min_s:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        if len(times) > 20000:
            break
    return times


def _row(kind: str, scheme: str, size: int, times: list[float]) -> dict:
    median = statistics.median(times)
    return {
        "kind": kind,
        "scheme": scheme,
        "bytes": size,
        "round_trip_us": round(median * 1e6, 1),
        "gbps": round(2 * size / median / 1e9, 3),  # payload out and back
    }


@click.command()
@click.option("--schemes", default="inproc,ipc,tcp", show_default=True, help="Comma-separated transports.")
@click.option("--seconds", default=0.5, show_default=True, help="Minimum time per measurement.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def transport(schemes: str, seconds: float, as_json: bool) -> None:
    """Round trip (median) and bandwidth of raw pynng vs the asyncflow runtime."""
    import tempfile

    import pynng

    from asyncflow.core import protocol
    from asyncflow.core.actor import serve_actor
    from asyncflow.core.directory import DirectoryClient, start_directory
    from asyncflow.core.echo import EchoActor
    from asyncflow.core.host import actor_spec, spawn_host
    from asyncflow.core.ref import ActorRef
    from asyncflow.core.transport import TransportConfig

    rows = []
    tmp = tempfile.mkdtemp(prefix="af-bench-")
    for scheme in schemes.split(","):
        transport_cfg = TransportConfig(scheme=scheme, secret="bench", ipc_dir=tmp)
        # raw pynng echo
        address = {"inproc": "inproc://raw-bench", "ipc": f"ipc://{tmp}/raw.sock", "tcp": "tcp://127.0.0.1:45871"}[scheme]
        ctx = mp.get_context("fork") if scheme == "inproc" else mp.get_context("spawn")
        ready = ctx.Event()
        if scheme == "inproc":
            import threading

            threading.Thread(target=_raw_server, args=(address, ready), daemon=True).start()
            proc = None
        else:
            proc = ctx.Process(target=_raw_server, args=(address, ready), daemon=True)
            proc.start()
        ready.wait(30)
        with pynng.Req0(recv_max_size=0) as sock:
            sock.dial(address, block=True)
            for size in SIZES_BYTES:
                payload = b"x" * size
                times = _time_calls(lambda: (sock.send(payload), sock.recv()), size, 20, seconds)
                rows.append(_row("raw", scheme, size, times))
        if proc is not None:
            proc.kill()
        # the runtime: an EchoActor in a process host (or here, for inproc)
        if scheme == "inproc":
            actor = serve_actor(EchoActor, "echo", transport_cfg)
            ref, stop = ActorRef("echo", actor.address, transport_cfg), actor.stop
        else:
            directory = start_directory(transport_cfg)
            client = DirectoryClient(directory.address, transport_cfg)
            host = spawn_host("bench", client, transport_cfg, [actor_spec("echo", EchoActor)])
            ref = client.ref("echo")

            def stop(host=host, directory=directory):
                host.stop()
                directory.stop()

        for size in SIZES_BYTES:
            msg = protocol.Echo(payload=memoryview(b"x" * size))
            times = _time_calls(lambda: ref.ask(msg), size, 20, seconds)
            rows.append(_row("asyncflow", scheme, size, times))
        stop()

    click.echo(f"{'kind':<10} {'scheme':<7} {'bytes':>10} {'round trip us':>14} {'GB/s':>7}")
    for r in rows:
        click.echo(f"{r['kind']:<10} {r['scheme']:<7} {r['bytes']:>10} {r['round_trip_us']:>14} {r['gbps']:>7}")
    if as_json:
        click.echo(json.dumps({"rows": rows}))
