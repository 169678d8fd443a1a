"""``afctl bench queue``: TransferQueue put/get across processes, as deployed.

The queue's controller (with the manager) runs in one process host, each shard in
its own; a producer process and a consumer process talk to them through TQClient.
Each round the producer allocates B rows and puts two columns (``input_ids`` int64
[L], ``old_logp`` float32 [L]); the consumer gets them as task ``train`` (metadata
from the controller, columns straight from the shards, copied out unless
``--zero-copy``) and checks them; it acks them inside its next request (as a
streaming consumer does), which frees them. First ``--rounds`` rounds in lockstep
(one round in flight), then ``--rounds`` rounds streaming (the producer runs ahead,
held back only by the queue's capacity of ``--window`` rounds). Figures:

- ``round_trip_ms``: median over lockstep rounds of (producer starts allocating ->
  consumer holds the data);
- ``samples_per_s``, ``gbps``: rows, and bytes put plus bytes read, over the wall time
  of the streaming rounds (``lockstep_gbps``: the same over the lockstep rounds);
- ``shard_mem_ratio``: the shards' peak resident memory above their idle baseline,
  plus the shared-memory segments they owned at peak, over the peak bytes of rows
  held (the interpreter's own ~50 MB is not counted against the rows).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

import click

COLUMNS = ["input_ids", "old_logp"]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _producer(directory: str, samples: int, seq_len: int, lockstep: int, streamed: int, use_shm: bool, done, out) -> None:
    import numpy as np

    from asyncflow.core.tq.client import TQClient

    tq = TQClient(directory, use_shm=use_shm)
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 32000, seq_len, dtype=np.int64) for _ in range(samples)]
    logp = [rng.standard_normal(seq_len, dtype=np.float32) for _ in range(samples)]

    def put_round(r: int) -> None:
        metas = tq.allocate(samples, step=r)
        for m in metas:
            m.response_len = seq_len
        tq.put([m.index for m in metas], {"input_ids": ids, "old_logp": logp}, metas)

    times = []
    for r in range(lockstep):  # one round in flight: latency
        t0 = time.monotonic()
        put_round(r)
        r_done, t_end = done.recv()
        assert r_done == r
        times.append((t0, t_end))
    t_stream = time.monotonic()
    for r in range(lockstep, lockstep + streamed):  # free-running, held back only by capacity
        put_round(r)
    r_done, t_end = done.recv()
    assert r_done == lockstep + streamed - 1
    tq.close()
    out.send((times, t_stream, t_end))


def _consumer(
    directory: str, samples: int, seq_len: int, lockstep: int, streamed: int, use_shm: bool, zero_copy: bool, done
) -> None:
    from asyncflow.core.tq.client import TQClient

    tq = TQClient(directory, use_shm=use_shm)
    batch = None
    for r in range(lockstep + streamed):
        # the previous batch is acked inside this request (one round trip less)
        batch = tq.get_batch("train", COLUMNS, samples, timeout_s=60, ack=batch, zero_copy=zero_copy)
        ids, logp = batch.columns["input_ids"], batch.columns["old_logp"]
        assert len(ids) == samples and ids[0].shape == (seq_len,) and logp[-1].dtype.name == "float32"
        assert all(m.step == r for m in batch.metas)
        del ids, logp
        if r < lockstep or r == lockstep + streamed - 1:
            done.send((r, time.monotonic()))
    if batch is not None:
        tq.ack(batch)
    tq.close()


def run_queue_bench(
    samples: int,
    seq_len: int,
    rounds: int,
    shards: int,
    warmup: int,
    use_shm: bool,
    zero_copy: bool = False,
    window_rounds: int = 4,
    inline_max_bytes: int | None = None,
) -> dict:
    from asyncflow.core.directory import DirectoryClient, start_directory
    from asyncflow.core.tq.client import TQClient
    from asyncflow.core.tq.launch import spawn_queue
    from asyncflow.core.transport import TransportConfig

    transport = TransportConfig(scheme="ipc")
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    queue_procs = None
    procs = []
    try:
        capacity_rows = max(1024, window_rounds * samples)  # how far the streaming producer may run ahead
        extra: dict[str, Any] = {} if inline_max_bytes is None else {"inline_max_bytes": inline_max_bytes}
        queue_procs = spawn_queue(dc, transport, ["train"], num_shards=shards, capacity_rows=capacity_rows, **extra)
        driver = TQClient(dc, use_shm=use_shm)
        baseline = {s.name: s.rss_bytes for s in driver.shard_stats()}
        pids = [h.pid for h in queue_procs.hosts]
        cpu0 = sum(_cpu_s(pid) for pid in pids)
        ctx = mp.get_context("spawn")
        done_recv, done_send = ctx.Pipe(duplex=False)
        out_recv, out_send = ctx.Pipe(duplex=False)
        lockstep = warmup + rounds
        consumer = ctx.Process(
            target=_consumer, args=(directory.address, samples, seq_len, lockstep, rounds, use_shm, zero_copy, done_send)
        )
        producer = ctx.Process(
            target=_producer, args=(directory.address, samples, seq_len, lockstep, rounds, use_shm, done_recv, out_send)
        )
        procs = [consumer, producer]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 600
        while not out_recv.poll(0.5):  # a process that died says so now, not after the deadline
            failed = [p for p in procs if p.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"bench {failed[0].name} exited with code {failed[0].exitcode} (its error is above)")
            if time.monotonic() > deadline:
                raise TimeoutError("the bench's producer reported nothing within 600 s")
        times, t_stream, t_stream_end = out_recv.recv()
        times = times[warmup:]
        queue_cpu_s = sum(_cpu_s(pid) for pid in pids) - cpu0
        for p in procs:
            p.join(30)
            if p.exitcode != 0:
                raise RuntimeError(f"bench {p.name} exited with code {p.exitcode}")
        stats = driver.shard_stats()
        driver.close()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        if queue_procs is not None:
            queue_procs.stop()
        directory.stop()
    round_trips = [end - start for start, end in times]
    lockstep_s = times[-1][1] - times[0][0]
    wall_s = t_stream_end - t_stream
    row_bytes = seq_len * (8 + 4)
    moved_bytes = 2 * rounds * samples * row_bytes  # put + read
    growth = sum(max(0, s.peak_rss_bytes - baseline[s.name]) + s.peak_shm_bytes for s in stats)
    peak_held = sum(s.peak_bytes for s in stats)
    return {
        "samples": samples,
        "seq_len": seq_len,
        "rounds": rounds,
        "shards": shards,
        "shm": use_shm,
        "round_trip_ms": round(statistics.median(round_trips) * 1e3, 3),
        "round_trip_p90_ms": round(sorted(round_trips)[int(0.9 * (len(round_trips) - 1))] * 1e3, 3),
        "samples_per_s": round(rounds * samples / wall_s, 1),
        "gbps": round(moved_bytes / wall_s / 1e9, 3),
        "shard_mem_ratio": round(growth / peak_held, 3) if peak_held else None,
        "shard_peak_rss_mb": round(max(s.peak_rss_bytes for s in stats) / 2**20, 1),
        "shard_peak_held_mb": round(peak_held / 2**20, 2),
        "lockstep_gbps": round(moved_bytes / lockstep_s / 1e9, 3),
        "zero_copy": zero_copy,
        "queue_cpu_ms_per_round": round(queue_cpu_s / (warmup + 2 * rounds) * 1e3, 3),  # controller + shards
        "load_avg_1m": os.getloadavg()[0],
    }


@click.command()
@click.option("--samples", "-B", default=8, type=click.IntRange(min=1), show_default=True, help="Rows per round.")
@click.option("--seq-len", "-L", default=64, type=click.IntRange(min=1), show_default=True, help="Tokens per row.")
@click.option("--rounds", "-n", default=200, type=click.IntRange(min=1), show_default=True, help="Measured rounds.")
@click.option(
    "--shards", "-S", default=1, type=click.IntRange(min=1), show_default=True, help="Storage shards (one process each)."
)
@click.option("--warmup", default=5, type=click.IntRange(min=0), show_default=True, help="Rounds run before measuring.")
@click.option(
    "--shm/--no-shm",
    "use_shm",
    default=True,
    show_default=True,
    help="Same-host shared-memory data path for puts of 1 MB or more.",
)
@click.option("--zero-copy", is_flag=True, help="Read shared-memory rows as views (valid until acked), not copies.")
@click.option(
    "--window",
    "window_rounds",
    default=4,
    type=click.IntRange(min=1),
    show_default=True,
    help="Queue capacity in rounds (at least 1024 rows): how far the streaming producer may run ahead.",
)
@click.option(
    "--inline-max-bytes",
    type=click.IntRange(min=0),
    default=None,
    help="Puts up to this size travel with their notice and come back in the GetBatch reply "
    "([queue] inline_max_bytes; default 16384; 0: always read from the shard).",
)
@click.option("--compare-inline", is_flag=True, help="Run twice, inline off then on, and print the round-trip ratio (off / on).")
@click.option(
    "--rows",
    default="",
    help="Rows per step, comma-separated (e.g. 4096,16384,65536): measure the queue host's CPU per row and "
    "GetBatch calls per step as rows and --replicas grow (bench/queue_scale.py), instead of put/get.",
)
@click.option("--replicas", default="8,64,512", show_default=True, help="With --rows: rollout replicas emulated.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def queue(
    samples: int,
    seq_len: int,
    rounds: int,
    shards: int,
    warmup: int,
    use_shm: bool,
    zero_copy: bool,
    window_rounds: int,
    inline_max_bytes: int | None,
    compare_inline: bool,
    rows: str,
    replicas: str,
    as_json: bool,
) -> None:
    """TransferQueue round trip and bandwidth, producer and consumer in their own processes;
    with --rows, the queue host's cost as rows per step and replicas grow."""
    if rows:
        from asyncflow.bench.queue_scale import _ints, run_matrix

        run_matrix(_ints(rows), _ints(replicas), steps=3, train_ms=500.0, as_json=as_json)
        return
    if compare_inline:
        off = run_queue_bench(samples, seq_len, rounds, shards, warmup, use_shm, zero_copy, window_rounds, 0)
        on = run_queue_bench(samples, seq_len, rounds, shards, warmup, use_shm, zero_copy, window_rounds, inline_max_bytes)
        result = {
            "round_trip_ms_read": off["round_trip_ms"],
            "round_trip_ms_inline": on["round_trip_ms"],
            "samples_per_s_read": off["samples_per_s"],
            "samples_per_s_inline": on["samples_per_s"],
            "round_trip_ratio": round(off["round_trip_ms"] / on["round_trip_ms"], 3),
            "load_avg_1m": os.getloadavg()[0],
        }
    else:
        result = run_queue_bench(samples, seq_len, rounds, shards, warmup, use_shm, zero_copy, window_rounds, inline_max_bytes)
    for key, value in result.items():
        click.echo(f"{key:>20}  {value}")
    if as_json:
        click.echo(json.dumps(result))
