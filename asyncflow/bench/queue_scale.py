"""``afctl bench queue --rows 4096,16384 --replicas 8,64,512``: the queue host's cost as
rows per step and rollout replicas grow, which should keep its control CPU per row flat
(docs/scale.md).

The queue runs as deployed (manager and controllers in one process host, one shard in
another); this process emulates the roles on threads, each with its own TQClient and
real nng sockets: a loader that writes every step's prompt groups ahead (up to the
staleness bound's capacity), ``R`` replicas that take whole groups whose step is at
most their version + k and put a response column (no model: generation is instant),
and a trainer that asks for each step's whole batch (its waiting GetBatch), "trains"
for ``--train-ms`` and announces the next version. While it trains, the replicas are
held back by the staleness bound: that is where polling costs.

Replicas behave as the queue allows: where GetBatch has ``min_rows`` (this tree) they
wait in the controller and the announcement wakes them (``TQClient.wake``); else they
poll as the replica did before, a partial GetBatch then up to 50 ms for the next
announcement. Run this file with another tree on PYTHONPATH to measure that tree:
``PYTHONPATH=/other/tree python asyncflow/bench/queue_scale.py --rows ...``.

Figures per (rows, replicas), over the measured steps (the first step is warm-up):
queue control process CPU per step and per row (manager + controllers), the shard's
CPU per row, and rollout GetBatch calls per step.
"""

from __future__ import annotations

import json
import os
import threading
import time

import click

G = 8  # rows per prompt group
GROUPS_PER_CALL = 4  # a replica's prompts_per_call
PUT_GROUPS = 64  # groups per loader put
POLL_S = 0.05  # the old replica's wait for an announcement


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_scale(rows: int, replicas: int, steps: int = 3, train_ms: float = 200.0, staleness: int = 1) -> dict:
    import numpy as np

    from asyncflow.core import protocol
    from asyncflow.core.directory import DirectoryClient, start_directory
    from asyncflow.core.tq.client import TQClient
    from asyncflow.core.tq.errors import BatchTimeout
    from asyncflow.core.tq.launch import spawn_queue
    from asyncflow.core.transport import TransportConfig

    waits = "min_rows" in protocol.GetBatch.__struct_fields__
    if rows % (G * PUT_GROUPS):
        raise click.BadParameter(f"rows per step must be a multiple of {G * PUT_GROUPS}")
    transport = TransportConfig(scheme="ipc")
    directory = start_directory(transport)
    queue = None
    clients: list = []
    stop = threading.Event()
    version = [0]
    announced = threading.Condition()
    polls = [0] * replicas
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []
    try:
        dc = DirectoryClient(directory.address, transport)
        queue = spawn_queue(dc, transport, ["rollout", "train"], num_shards=1, capacity_rows=rows * (staleness + 2))
        control_pid, shard_pid = queue.hosts[0].pid, queue.hosts[1].pid

        def client(name: str):
            c = TQClient(
                DirectoryClient(directory.address, transport), consumer=name, reserve_rows=0, use_shm=False, freeze_timeout_s=0
            )
            clients.append(c)
            return c

        prompt = np.arange(16, dtype=np.int64)
        response = np.arange(8, dtype=np.int64)

        def loader() -> None:
            tq = client("loader")
            for step in range(steps + staleness + 1):
                for _ in range(rows // (G * PUT_GROUPS)):
                    metas = tq.allocate(PUT_GROUPS, G, step=step, timeout_s=600)
                    tq.put([m.index for m in metas], {"prompt_ids": [prompt] * len(metas)}, metas)
                    if stop.is_set():
                        return

        def replica(k: int, tq) -> None:
            done: list[int] = []
            while not stop.is_set():
                wakes = tq.wakes("rollout") if waits else 0
                v = version[0]
                kwargs = {"min_rows": G, "timeout_s": 30.0, "wakes": wakes} if waits else {}
                meta = tq.get_meta(
                    "rollout",
                    ["prompt_ids"],
                    GROUPS_PER_CALL * G,
                    policy="group",
                    partial=True,
                    max_step=v + staleness,
                    ack=done,
                    **kwargs,
                )
                polls[k] += 1
                done = meta.indices
                if done:
                    tq.put(done, {"response_ids": [response] * len(done)}, meta.metas)
                elif not waits:
                    with announced:
                        if version[0] == v:
                            announced.wait(POLL_S)

        def guarded(fn, *args) -> None:
            try:
                fn(*args)
            except BaseException as exc:  # reported by the main thread
                if not stop.is_set():
                    errors.append(exc)
                    stop.set()

        replica_clients = [client(f"rollout.{k}") for k in range(replicas)]
        trainer = client("trainer")
        threads.append(threading.Thread(target=guarded, args=(loader,), daemon=True))
        threads += [threading.Thread(target=guarded, args=(replica, k, c), daemon=True) for k, c in enumerate(replica_clients)]
        for t in threads:
            t.start()
        marks = []  # (time, control cpu, shard cpu, polls) at each step's start
        prev: list[int] = []
        for step in range(steps):
            marks.append((time.monotonic(), _cpu_s(control_pid), _cpu_s(shard_pid), sum(polls)))
            while True:
                if errors:
                    raise errors[0]
                try:
                    batch = trainer.get_meta(
                        "train",
                        ["prompt_ids", "response_ids"],
                        rows,
                        policy="group",
                        min_step=step,
                        max_step=step,
                        timeout_s=1.0,
                        ack=prev,
                    )
                    break
                except BatchTimeout:
                    prev = []
            prev = batch.indices
            time.sleep(train_ms / 1e3)  # the step trains; replicas are held back by the bound meanwhile
            with announced:
                version[0] = step + 1
                announced.notify_all()
            if waits:
                for c in replica_clients:
                    c.wake("rollout")
        marks.append((time.monotonic(), _cpu_s(control_pid), _cpu_s(shard_pid), sum(polls)))
    finally:
        stop.set()
        with announced:
            announced.notify_all()
        if waits:
            for c in clients:
                c.wake("rollout")
            for c in clients:
                c.flush_wakes()
        for t in threads:
            t.join(2)
        for c in clients:
            c.close()
        if queue is not None:
            queue.kill()
        directory.stop()
    (t0, c0, s0, p0), (t1, c1, s1, p1) = marks[1], marks[-1]
    n = steps - 1
    return {
        "rows_per_step": rows,
        "replicas": replicas,
        "waits_in_queue": waits,
        "steps": n,
        "step_s": round((t1 - t0) / n, 3),
        "control_cpu_ms_per_step": round((c1 - c0) / n * 1e3, 1),
        "control_cpu_us_per_row": round((c1 - c0) / n / rows * 1e6, 2),
        "shard_cpu_us_per_row": round((s1 - s0) / n / rows * 1e6, 2),
        "rollout_gets_per_step": round((p1 - p0) / n, 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def run_matrix(rows: list[int], replicas: list[int], steps: int, train_ms: float, as_json: bool) -> list[dict]:
    results = []
    click.echo(
        f"{'rows':>6} {'replicas':>8} {'waits':>5} {'step_s':>7} {'ctl ms/step':>11} {'ctl us/row':>10} "
        f"{'shard us/row':>12} {'gets/step':>9}"
    )
    for n in rows:
        for r in replicas:
            res = run_scale(n, r, steps=steps, train_ms=train_ms)
            results.append(res)
            click.echo(
                f"{n:>6} {r:>8} {str(res['waits_in_queue']):>5} {res['step_s']:>7} {res['control_cpu_ms_per_step']:>11} "
                f"{res['control_cpu_us_per_row']:>10} {res['shard_cpu_us_per_row']:>12} {res['rollout_gets_per_step']:>9}"
            )
    if as_json:
        click.echo(json.dumps(results))
    return results


@click.command()
@click.option("--rows", default="4096,16384,65536", show_default=True, help="Rows per step, comma-separated.")
@click.option("--replicas", default="8,64,512", show_default=True, help="Rollout replicas (pollers), comma-separated.")
@click.option("--steps", default=3, type=click.IntRange(min=2), show_default=True, help="Steps per case (the first is warm-up).")
@click.option("--train-ms", default=200.0, show_default=True, help="Emulated training time per step.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list as the last line.")
def main(rows: str, replicas: str, steps: int, train_ms: float, as_json: bool) -> None:
    run_matrix(_ints(rows), _ints(replicas), steps, train_ms, as_json)


if __name__ == "__main__":
    main()
