"""``afctl bench decode``: the native engine's decode step, eager against compiled
(``rollout.engine.compile``, engines/compiled_decode.py), milliseconds per step at each
``--rows``, side by side in one process on one engine (one model, one KV pool).

Each row holds ``--context`` tokens of KV (its own blocks, a copy of one prefill of random
tokens) and feeds a random token at the next position, as a decode step of a batch that
far into its sequences does; the
compiled step pads the rows to its bucket, the eager one runs them as they are; both
attend over the keys bucket, as the engine's steps do. Per rows: one eager step and the compiled step's first call (its compile,
timed once: ``compile_s``), then ``--steps`` of each alternating, medians reported. The
same inputs' logits are compared: the largest gap of their float32 log-softmax and
whether every row's greedy token is the same.
"""

from __future__ import annotations

import functools
import json
import statistics
import time

import click

from asyncflow.bench.shared_inputs import bench_tiny_model, model_option


@click.command("decode")
@click.option("--rows", default="8,64,256", show_default=True, help="Comma-separated rows per decode step.")
@click.option("--context", default=80, show_default=True, help="KV tokens each row holds before the step.")
@click.option("--steps", default=10, show_default=True, help="Timed steps of each side per rows.")
@click.option("--threads", default=2, show_default=True, help="torch intra-op threads (cpu).")
@click.option("--device", type=click.Choice(["cpu", "cuda", "npu"]), default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True)
@click.option("--hidden-size", default=128, show_default=True)
@click.option("--num-layers", default=4, show_default=True)
@model_option("--hidden-size and --num-layers are then ignored")
@click.option("--json", "as_json", is_flag=True, help="Last line: one JSON object.")
def decode(rows, context, steps, threads, device, dtype, hidden_size, num_layers, model_path, as_json):
    """Decode ms/step, eager vs compiled, at each --rows (and the compile time paid once)."""
    import torch

    from asyncflow.engines.compiled_decode import pad_keys
    from asyncflow.engines.config import RolloutEngineConfig
    from asyncflow.engines.factory import build_rollout_engine

    torch.set_num_threads(threads)
    sizes = [int(r) for r in rows.split(",")]
    if model_path:
        from pathlib import Path

        model_dir, label = model_path, f"model {Path(model_path).name}"
    else:
        model_dir = bench_tiny_model("bench_decode_", hidden_size, num_layers)
        label = f"model hidden {hidden_size} x {num_layers} layers"
    cfg = RolloutEngineConfig(type="native", device=device, dtype=dtype, compile="on", max_batch_size=max(sizes))
    probe = build_rollout_engine(msgspec_replace(cfg, kv_cache_bytes=1 << 20, compile="off"), model_dir)
    per_token = probe.pool.bytes_per_token
    block_tokens = probe.pool.block_tokens
    probe.close()
    blocks_per_row = -(-context // block_tokens) + 1  # the step's new token may open a block
    kv_bytes = max(sizes) * blocks_per_row * block_tokens * per_token
    engine = build_rollout_engine(msgspec_replace(cfg, kv_cache_bytes=kv_bytes), model_dir)
    decoder, pool, compiled = engine.decoder, engine.pool, engine.compiled
    assert compiled is not None, "the native engine with compile = 'on'"
    dev = pool.k.device
    g = torch.Generator().manual_seed(0)
    vocab = decoder.config.vocab_size
    # every row's blocks, holding the KV of one prefill of --context random tokens (a real cache's magnitudes)
    slot_table_RK = torch.stack([pool.slots(pool.allocate(blocks_per_row * block_tokens)) for _ in range(max(sizes))])
    slot_table_RK = slot_table_RK.to(dev)
    context_1C = torch.randint(0, vocab, (1, context), generator=g).to(dev)
    decoder.step(
        pool,
        context_1C,
        torch.arange(context, device=dev).unsqueeze(0),
        None,
        slot_table_RK[:1],
        last_B=torch.zeros(1, dtype=torch.long, device=dev),
    )
    src, dst = slot_table_RK[:1, :context].repeat(len(slot_table_RK) - 1, 1), slot_table_RK[1:, :context]
    pool.k[:, dst.reshape(-1)] = pool.k[:, src.reshape(-1)]
    pool.v[:, dst.reshape(-1)] = pool.v[:, src.reshape(-1)]

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    results = []
    for B in sizes:
        ids_B1 = torch.randint(0, vocab, (B, 1), generator=g).to(dev)
        pos_B1 = torch.full((B, 1), context, dtype=torch.long, device=dev)
        # both sides attend over the keys bucket, as the engine's decode steps do (compiled_decode.pad_keys)
        table_BK = pad_keys(slot_table_RK[:B], context + 1, compiled.key_sizes)
        last_B = torch.zeros(B, dtype=torch.long, device=dev)

        eager = functools.partial(decoder.step, pool, ids_B1, pos_B1, None, table_BK, last_B)
        graph = functools.partial(compiled.step, ids_B1, pos_B1, table_BK)

        def timed(fn) -> tuple[float, torch.Tensor]:
            start = time.perf_counter()
            out = fn()
            sync()
            return (time.perf_counter() - start) * 1000, out

        _, eager_logits = timed(eager)
        key = compiled.key(B, context + 1)
        _, graph_logits = timed(graph)
        compile_s = compiled.compile_s.get(key, 0.0)
        gap = (torch.log_softmax(eager_logits.float(), -1) - torch.log_softmax(graph_logits.float(), -1)).abs().max()
        same_greedy = bool((eager_logits.argmax(-1) == graph_logits.argmax(-1)).all())
        eager_ms, graph_ms = [], []
        for _ in range(steps):
            eager_ms.append(timed(eager)[0])
            graph_ms.append(timed(graph)[0])
        e, c = statistics.median(eager_ms), statistics.median(graph_ms)
        row = {
            "rows": B,
            "eager_ms": round(e, 2),
            "compiled_ms": round(c, 2),
            "speedup": round(e / c, 3),
            "compile_s": round(compile_s, 1),
            "graph_rows": key.rows,
            "graph_keys": key.keys,
            "max_logp_gap": float(gap),
            "same_greedy": same_greedy,
        }
        results.append(row)
        click.echo(
            f"rows {B}: eager {e:.1f} ms/step, compiled {c:.1f} ms/step ({e / c:.2f}x; graph {key.rows} rows x "
            f"{key.keys} keys, compiled in {compile_s:.1f} s); log-prob gap {float(gap):.2g}, same greedy {same_greedy}"
        )
    click.echo(f"{label}, context {context}, device {device}, dtype {dtype}, threads {threads}; recompiles {compiled.recompiles}")
    if as_json:
        click.echo(
            json.dumps(
                {
                    "rows": results,
                    "context": context,
                    "steps": steps,
                    "device": device,
                    "dtype": dtype,
                    "threads": threads,
                    "model": label,
                    "recompiles": compiled.recompiles,
                    "torch": torch.__version__,
                }
            )
        )


def msgspec_replace(cfg, **changes):
    import msgspec

    return msgspec.structs.replace(cfg, **changes)
