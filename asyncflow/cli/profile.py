"""``afctl profile``: calibrate the planner's efficiency factors by running the real engines.

At a few small model sizes (tiny Qwen2 models built offline by
``asyncflow.toy.tiny``) it times, on one device (one core, one torch thread, on
cpu):
- decode iterations of the native rollout engine at several batch sizes,
- prefill of batches of long prompts,
- training steps (forward + backward + AdamW) of the torch training engine,
- forward passes (reference log-probs) of the same engine.
Each measurement's work is computed with the planner's own formulas (bf16 bytes,
2 or 6 FLOPs per parameter per token), so the fitted factor maps the planner's
arithmetic onto real seconds: time = overhead + work / (efficiency x peak).
"""

from __future__ import annotations

import datetime as _dt
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

# (hidden, layers, heads, kv heads, intermediate): around 0.1 M to 5 M parameters.
SIZES = [(64, 2, 4, 2, 192), (128, 4, 4, 2, 384), (256, 4, 8, 4, 768), (384, 6, 8, 4, 1152)]
QUICK_SIZES = SIZES[:2]

if TYPE_CHECKING:
    from asyncflow.engines.config import Device


def _median_time(fn, repeats: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _measure(model_dir: Path, shape, repeats: int, device: Device) -> list:
    import torch

    from asyncflow.engines.base import TokenBatch
    from asyncflow.engines.config import RolloutEngineConfig, SamplingParams, TrainEngineConfig
    from asyncflow.engines.factory import build_rollout_engine, build_train_engine
    from asyncflow.planner.calibration import Point
    from asyncflow.planner.cost import DTYPE_BYTES

    size = f"hidden {shape.hidden_size}, {shape.num_layers} layers, {shape.num_params / 1e6:.2f} M params"
    points = []
    rollout = build_rollout_engine(
        RolloutEngineConfig(device=device, max_batch_size=64, kv_cache_bytes=64 * 2**20, num_threads=1), model_dir
    )
    prompt_len, new_tokens = 16, 48
    for batch in (1, 8, 32):
        prompts = [[7 + (i + j) % 50 for j in range(prompt_len)] for i in range(batch)]
        only_prefill = _median_time(lambda: rollout.generate(prompts, SamplingParams(max_new_tokens=1, seed=0)), repeats)
        full = _median_time(lambda: rollout.generate(prompts, SamplingParams(max_new_tokens=new_tokens, seed=0)), repeats)
        iterations = max(rollout.stats.num_steps, 1)  # type: ignore[attr-defined]  # the native engine's (the default type)
        context = prompt_len + new_tokens / 2
        work = shape.num_params * DTYPE_BYTES + batch * shape.kv_bytes_per_token() * context
        points.append(
            Point(
                kind="decode",
                size=f"{size}, batch {batch}",
                work=work,
                time_s=max(full - only_prefill, 1e-9) / iterations,
                flops=batch * shape.forward_flops_per_token(context),
                batch=batch,
                num_layers=shape.num_layers,
            )
        )
    # prefill (one generate call of one token): long prompts for the arithmetic, one short
    # prompt and many for the per-call and per-sequence costs of a call
    for batch, plen in ((1, 8), (4, 128), (16, 128), (64, 8)):
        prompts = [[7 + (i + j) % 50 for j in range(plen)] for i in range(batch)]
        t = _median_time(lambda: rollout.generate(prompts, SamplingParams(max_new_tokens=1, seed=0)), repeats)
        work = batch * shape.prefill_flops(plen)
        points.append(
            Point(
                kind="prefill",
                size=f"{size}, {batch} x {plen} tokens",
                work=work,
                time_s=t,
                num_layers=shape.num_layers,
                batch=batch,
            )
        )
    rollout.close()

    seq_len = 64
    for batch in (4, 16):
        trainer = build_train_engine(TrainEngineConfig(device=device, micro_batch_size=batch, num_threads=1), model_dir)
        ids = torch.randint(7, 57, (batch, seq_len))
        mask = torch.ones((batch, seq_len), dtype=torch.long)
        response = torch.zeros((batch, seq_len))
        response[:, seq_len // 2 :] = 1.0
        tb = TokenBatch(input_ids=ids, attention_mask=mask, response_mask=response)

        def loss_fn(out, mb, ctx):
            return -(out.logp * mb.response_mask).sum() / ctx.num_tokens, {}

        tokens = batch * seq_len
        t_train = _median_time(lambda: trainer.train_step(tb, loss_fn), repeats)
        points.append(
            Point(
                kind="train",
                size=f"{size}, {batch} x {seq_len}",
                time_s=t_train,
                work=3 * tokens * shape.forward_flops_per_token(seq_len / 2),
                num_layers=shape.num_layers,
                tokens=tokens,
            )
        )
        t_fwd = _median_time(lambda: trainer.forward(tb), repeats)
        points.append(
            Point(
                kind="forward",
                size=f"{size}, {batch} x {seq_len}",
                time_s=t_fwd,
                work=tokens * shape.forward_flops_per_token(seq_len / 2),
                num_layers=shape.num_layers,
                tokens=tokens,
            )
        )
    # the trainer's weight publish: export a host copy, chunk it for the replicas (weight_sync.publish)
    t_snap = _median_time(lambda: _stage(list(trainer.export_weights())), repeats)
    points.append(Point(kind="snapshot", size=size, work=float(shape.num_params), time_s=t_snap))
    return points


def _stage(named_tensors: list) -> list:
    """What WeightSyncActor.publish does to a snapshot before announcing it."""
    from asyncflow.core.tensors import to_wire
    from asyncflow.engines.base import chunk_by_bytes

    return [[to_wire(t) for _, t in chunk] for chunk in chunk_by_bytes(named_tensors, 32 << 20)]


def _measure_corun(model_dir: Path, repeats: int, device: Device) -> list:
    """The same train step (the smallest model, 16 x 64 tokens) alone, then in two forked
    processes at once: what sharing the machine with our other compute costs a stage
    (caches, memory bandwidth, SMT siblings, and other sessions' load at the time)."""
    import multiprocessing as mp

    import torch

    from asyncflow.engines.base import TokenBatch
    from asyncflow.engines.config import TrainEngineConfig
    from asyncflow.engines.factory import build_train_engine
    from asyncflow.planner.calibration import Point

    trainer = build_train_engine(TrainEngineConfig(device=device, micro_batch_size=16, num_threads=1), model_dir)
    ids = torch.randint(7, 57, (16, 64))
    tb = TokenBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=torch.ones((16, 64)))

    def loss_fn(out, mb, ctx):
        return -(out.logp * mb.response_mask).sum() / ctx.num_tokens, {}

    n = max(repeats, 5)
    points = [Point(kind="corun", size="alone", work=1.0, time_s=_median_time(lambda: trainer.train_step(tb, loss_fn), n))]
    ctx = mp.get_context("fork")  # the children inherit the built engine: no import or build to wait for
    start = ctx.Event()
    pipes, procs = [], []

    def child(conn) -> None:
        start.wait()
        conn.send(_median_time(lambda: trainer.train_step(tb, loss_fn), n))
        conn.close()

    for _ in range(2):
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=child, args=(send,), daemon=True)
        proc.start()
        pipes.append(recv)
        procs.append(proc)
    start.set()
    for recv in pipes:
        if recv.poll(120):
            points.append(Point(kind="corun", size="two at once", work=2.0, time_s=recv.recv()))
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    return points


def _measure_handoff(directory_address: str, tq, rounds: int, rows: int = 64) -> list:
    """From a put's return to a consumer blocked in another process holding the rows:
    the shard's notice to the controller, its reply to the waiting GetBatch, the wake-up.
    Every unit pays it between the role that puts and the role that waits."""
    import multiprocessing as mp

    import numpy as np

    from asyncflow.planner.calibration import Point

    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_handoff_consumer, args=(directory_address, rounds + 1, rows, send), daemon=True)
    proc.start()
    cols = {"response_ids": [np.arange(6, dtype=np.int64) for _ in range(rows)]}
    gaps = []
    try:
        if not recv.poll(120):
            return []
        recv.recv()  # the consumer is up (EOFError: it died)
        for r in range(rounds + 1):
            metas = tq.allocate(rows, step=HANDOFF_STEP + r)
            time.sleep(0.05)  # let the consumer block in its GetBatch, as a waiting role does (not a synchronisation)
            put_start = time.monotonic()
            tq.put([m.index for m in metas], cols, metas)
            if not recv.poll(60):
                break
            if r:  # the first round warms up
                gaps.append(recv.recv() - put_start)
            else:
                recv.recv()
    except EOFError:
        log_ = "the handoff consumer exited early"
        click.echo(f"  ({log_}; no handoff point)", err=True)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    if not gaps:
        return []
    return [
        Point(
            kind="handoff",
            size=f"put of {rows} rows starts -> a waiting consumer holds them",
            work=float(rows),
            time_s=max(statistics.median(gaps), 1e-6),
        )
    ]


TRAINER_ROWS = (32, 128, 512)


def _measure_trainer_rows(repeats: int) -> list:
    """The trainer's work on a step's rows outside train_step (actors/trainer/policy.py): token
    batching of queue rows into a padded batch, rewards, GRPO advantages broadcast to
    tokens, the step's figures. Rows of 8 prompt + 1 to 6 response tokens, groups of 8."""
    import msgspec
    import numpy as np
    import torch

    from asyncflow.actors.runtime.batching import token_batch
    from asyncflow.algorithms.advantages import broadcast_to_tokens, grpo_advantages
    from asyncflow.planner.calibration import Point

    rng = np.random.default_rng(0)
    points = []
    audit = Path(tempfile.mkdtemp(prefix="afctl-profile-audit-")) / "trained.jsonl"
    for rows in TRAINER_ROWS:
        prompts = [rng.integers(7, 50, 8).astype(np.int64) for _ in range(rows)]
        responses = [rng.integers(7, 50, int(rng.integers(1, 7))).astype(np.int64) for _ in range(rows)]
        logps = [(-rng.random(len(r))).astype(np.float32) for r in responses]
        rewards = [np.array([rng.random()], dtype=np.float32) for _ in range(rows)]

        def step():
            tb, _ = token_batch(prompts, responses, {"rollout_logp": logps})
            rewards_B = torch.tensor([float(r[0]) for r in rewards])
            adv_GN = grpo_advantages(rewards_B.view(-1, 8))
            tb.advantages = broadcast_to_tokens(adv_GN.reshape(-1), tb.response_mask)
            figures = torch.tensor(
                [
                    float(len(rewards_B)),
                    float(rewards_B.sum()),
                    float(sum(len(r) for r in responses)),
                    float(sum(len(p) for p in prompts)),
                ],
                dtype=torch.float64,
            )
            # the step's audit line (RUN_DIR/trained.jsonl) and its metrics message
            line = {
                "step": 0,
                "indices": list(range(rows)),
                "groups": [i // 8 for i in range(rows)],
                "versions": [0] * rows,
                "ranks": [0] * rows,
            }
            with audit.open("a") as f:
                f.write(msgspec.json.encode(line).decode() + "\n")
            msgspec.msgpack.encode({f"figure_{i}": float(v) for i, v in enumerate(figures.tolist() * 6)})
            return tb

        points.append(Point(kind="trainer", size=f"{rows} rows", work=float(rows), time_s=_median_time(step, repeats)))
    return points


QUEUE_ROWS = (8, 64, 256)


HANDOFF_STEP = 10_000  # the handoff rounds' steps: above the rows the other queue measurements left


def _handoff_consumer(directory: str, rounds: int, rows: int, conn) -> None:
    """A consumer in its own process, blocked on the ``train`` task as a role waits for
    its rows; sends the monotonic time at which it holds each round's rows."""
    from asyncflow.core.tq.client import TQClient

    tq = TQClient(directory, consumer="handoff")
    conn.send("ready")
    for _ in range(rounds):
        batch = tq.get_batch("train", ["response_ids"], rows, timeout_s=60, min_step=HANDOFF_STEP)
        conn.send(time.monotonic())
        tq.ack(batch)
    tq.close()


def _measure_queue(repeats: int) -> list:
    """One ask to the queue's actors, as deployed (controller and shard in their own
    processes, nng ipc): allocate, put of small columns, get_meta, read, ack of
    `rows` rows, each one request-reply, timed from this process."""
    import numpy as np

    from asyncflow.core.directory import DirectoryClient, start_directory
    from asyncflow.core.tq.client import TQClient
    from asyncflow.core.tq.launch import spawn_queue
    from asyncflow.core.transport import TransportConfig
    from asyncflow.planner.calibration import Point

    transport = TransportConfig(scheme="ipc")
    directory = start_directory(transport)
    procs = None
    points = []
    try:
        dc = DirectoryClient(directory.address, transport)
        # the tasks of a run (actors/driver/launcher.py), so a put notifies as many controllers
        procs = spawn_queue(dc, transport, ["rollout", "reward", "train"], num_shards=1, capacity_rows=4096)
        tq = TQClient(dc, consumer="profile")
        for rows in QUEUE_ROWS:
            # a rollout unit's put: responses, their log-probs, the finish flag
            cols: dict[str, Sequence[Any]] = {
                "response_ids": [np.arange(6, dtype=np.int64) for _ in range(rows)],
                "rollout_logp": [np.zeros(6, dtype=np.float32) for _ in range(rows)],
                "finish": [np.ones(1, dtype=np.uint8) for _ in range(rows)],
            }
            times: dict[str, list[float]] = {"put": [], "get_meta": [], "read": [], "ack": []}
            for r in range(repeats + 1):
                metas = tq.allocate(rows, step=r)
                for m in metas:
                    m.response_len = 6
                t0 = time.perf_counter()
                tq.put([m.index for m in metas], cols, metas)
                t1 = time.perf_counter()
                meta = tq.get_meta("reward", list(cols), rows, timeout_s=30)
                t2 = time.perf_counter()
                tq.read(meta.indices, list(cols))
                t3 = time.perf_counter()
                tq.ack("reward", meta.indices)
                t4 = time.perf_counter()
                if r:  # the first round warms up
                    for name, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                        times[name].append(dt)
            for name, ts in times.items():
                points.append(Point(kind="queue", size=f"{name} of {rows} rows", work=float(rows), time_s=statistics.median(ts)))
        points += _measure_handoff(directory.address, tq, max(repeats, 5))
        tq.close()
    finally:
        if procs is not None:
            procs.stop()
        directory.stop()
    return points


CHECK_SIZE = (320, 5, 8, 4, 960)  # between the fitted sizes, not one of them


def check_step(model_dir: Path, shape, eff, hw, device: Device, repeats: int) -> dict[str, tuple[float, float]]:
    """One colocated GRPO-like step on one device with the real engines: generate, reference
    forward, train step. Returns phase -> (predicted s, measured s)."""
    import torch

    from asyncflow.engines.base import TokenBatch
    from asyncflow.engines.config import RolloutEngineConfig, SamplingParams, TrainEngineConfig
    from asyncflow.engines.factory import build_rollout_engine, build_train_engine
    from asyncflow.planner.cost import Workload, forward_cost, rollout_cost, train_cost

    prompts_n, samples, prompt_len, new_tokens = 8, 4, 16, 48
    seqs, seq_len = prompts_n * samples, prompt_len + new_tokens
    wl = Workload(
        prompt_len_tokens=prompt_len,
        response_len_tokens=new_tokens,
        max_response_len_tokens=new_tokens,
        prompts_per_step=prompts_n,
        samples_per_prompt=samples,
        train_micro_batch_tokens=seqs * seq_len,
    )
    predicted = {
        "generate": rollout_cost(shape, hw, eff, wl, 1, 1).time_s,
        "reference forward": forward_cost(shape, hw, eff, wl, 1, 1).time_s,
        "train step": train_cost(shape, hw, eff, wl, 1, 1, 1).time_s,
    }
    rollout = build_rollout_engine(
        RolloutEngineConfig(device=device, max_batch_size=seqs, kv_cache_bytes=64 * 2**20, num_threads=1), model_dir
    )
    prompts = [[7 + (i * 3 + j) % 50 for j in range(prompt_len)] for i in range(prompts_n)]
    params = SamplingParams(max_new_tokens=new_tokens, n=samples, seed=0)
    measured = {"generate": _median_time(lambda: rollout.generate(prompts, params), repeats)}
    rollout.close()
    trainer = build_train_engine(TrainEngineConfig(device=device, micro_batch_size=seqs, num_threads=1), model_dir)
    ids = torch.randint(7, 57, (seqs, seq_len))
    response = torch.zeros((seqs, seq_len))
    response[:, prompt_len:] = 1.0
    batch = TokenBatch(input_ids=ids, attention_mask=torch.ones((seqs, seq_len), dtype=torch.long), response_mask=response)

    def loss_fn(out, mb, ctx):
        return -(out.logp * mb.response_mask).sum() / ctx.num_tokens, {}

    measured["reference forward"] = _median_time(lambda: trainer.forward(batch), repeats)
    measured["train step"] = _median_time(lambda: trainer.train_step(batch, loss_fn), repeats)
    return {k: (predicted[k], measured[k]) for k in predicted}


@click.command()
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="Profile file to write (.json or .toml).")
@click.option("--hardware", default="cpu", show_default=True, help="Hardware profile whose peaks the factors refer to.")
@click.option(
    "--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda", "npu"]), help="Where the engines run."
)
@click.option("--quick", is_flag=True, help="Two small sizes only (a few seconds).")
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed repetitions per measurement (median kept).")
@click.option(
    "--check/--no-check",
    default=True,
    show_default=True,
    help="Then predict and time one step of a held-out model size with the fitted factors.",
)
def profile(out_path, hardware, device, quick, repeats, check) -> None:
    """Calibrate the planner: time the real engines at small sizes and fit efficiency factors.

    Then: afctl plan --profile FILE ...
    """
    from transformers.utils import logging as hf_logging

    from asyncflow.planner.calibration import Profile, fit_errors, fit_profile
    from asyncflow.planner.hardware import get_hardware
    from asyncflow.planner.io import from_hf_config, save_profile
    from asyncflow.toy.tiny import make_tiny_model

    hf_logging.disable_progress_bar()
    try:
        hw = get_hardware(hardware)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    points = []
    with tempfile.TemporaryDirectory(prefix="afctl-profile-") as tmp:
        for i, (hidden, layers, heads, kv_heads, inter) in enumerate(QUICK_SIZES if quick else SIZES):
            model_dir = make_tiny_model(
                Path(tmp) / f"m{i}",
                hidden_size=hidden,
                num_layers=layers,
                num_heads=heads,
                num_kv_heads=kv_heads,
                intermediate_size=inter,
            )
            shape = from_hf_config(model_dir)
            click.echo(f"profiling {shape.num_params / 1e6:.2f} M params (hidden {hidden}, {layers} layers) ...", err=True)
            points += _measure(model_dir, shape, repeats, device)
        click.echo("profiling the trainer's own step work and queue asks ...", err=True)
        points += _measure_trainer_rows(repeats)
        # forked before this process starts the queue's processes and its nng threads
        points += _measure_corun(
            make_tiny_model(
                Path(tmp) / "corun",
                hidden_size=SIZES[0][0],
                num_layers=SIZES[0][1],
                num_heads=SIZES[0][2],
                num_kv_heads=SIZES[0][3],
                intermediate_size=SIZES[0][4],
            ),
            repeats,
            device,
        )
        points += _measure_queue(max(repeats, 5))
    eff = fit_profile(points, hw)
    errors = fit_errors(points, eff, hw)
    prof = Profile(
        hardware=hw.name,
        efficiency=eff,
        points=points,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        notes=f"afctl profile on {device}, one torch thread per device, tiny Qwen2 models; work in planner units (bf16 bytes); "
        f"mean fit error: " + ", ".join(f"{k} {v:.0%}" for k, v in errors.items()),
    )
    save_profile(prof, out_path)
    for name in (
        "prefill_flops",
        "decode_bandwidth",
        "train_flops",
        "forward_flops",
        "decode_overhead_s",
        "decode_overhead_s_per_layer",
        "decode_overhead_s_per_seq",
        "prefill_overhead_s_per_layer",
        "train_overhead_s",
        "forward_overhead_s",
        "train_overhead_s_per_token_layer",
        "forward_overhead_s_per_token_layer",
        "generate_overhead_s",
        "generate_overhead_s_per_seq",
        "trainer_overhead_s",
        "trainer_overhead_s_per_row",
        "snapshot_overhead_s",
        "snapshot_s_per_param",
        "queue_ask_s",
        "queue_ask_s_per_row",
        "queue_handoff_s",
        "corun_slowdown",
    ):
        click.echo(f"  {name:27s} {getattr(eff, name):.4g}")
    click.echo("  mean fit error: " + ", ".join(f"{k} {v:.0%}" for k, v in errors.items()))
    click.echo(f"wrote {out_path} ({len(points)} measurements); use it with: afctl plan --profile {out_path}")
    if check:
        hidden, layers, heads, kv_heads, inter = CHECK_SIZE
        with tempfile.TemporaryDirectory(prefix="afctl-profile-check-") as tmp:
            model_dir = make_tiny_model(
                Path(tmp) / "check",
                hidden_size=hidden,
                num_layers=layers,
                num_heads=heads,
                num_kv_heads=kv_heads,
                intermediate_size=inter,
            )
            shape = from_hf_config(model_dir)
            result = check_step(model_dir, shape, eff, hw, device, repeats)
        click.echo(f"check on a held-out size ({shape.num_params / 1e6:.2f} M params), 8 prompts x 4 samples, 16 + 48 tokens:")
        total_p = total_m = 0.0
        for phase, (pred, meas) in result.items():
            total_p, total_m = total_p + pred, total_m + meas
            click.echo(f"  {phase:18s} predicted {pred:7.3f} s  measured {meas:7.3f} s  error {pred / meas - 1:+.0%}")
        click.echo(
            f"  {'sync step':18s} predicted {total_p:7.3f} s  measured {total_m:7.3f} s  error {total_p / total_m - 1:+.0%}"
        )
