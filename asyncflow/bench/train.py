"""``afctl bench train``: training tokens per second of the torch training engine,
one process against two-process FSDP2 (gloo on cpu), on the same tiny model (or
``--model DIR``: a real one) and
the same global batch; with ``--packing``, one process with sequence packing on
against off (``train.engine.packing``) on a batch with long-tailed lengths; with
``--share-prompts``, one process with ``train.engine.share_prompts`` off against on,
on groups of rows that share a prompt (``bench/_train_shared.py``); with
``--autocast``, one process in float32 against bfloat16 autocast
(``train.engine.autocast``). Each one-process figure also says how close it comes to the
machine's arithmetic peak (``bench/flops.py``): 6 x parameters x tokens per second against
a square matmul of its dtype, timed on the spot with the same threads.

Each configuration runs a warm-up step then ``--steps`` timed optimizer steps of a
GRPO-shaped loss over the same global batch (FSDP: each rank takes half the rows).
Tokens counted are the real (unpadded) tokens of the global batch. One process runs
with ``--threads`` intra-op threads, each FSDP rank with one. The load average is
printed with the figures: on a shared 2-core machine, more busy threads than cores
(other jobs, or 2 threads beside them) slows OpenMP badly, and the figures show it.

``--packing``: most responses are short and every ``--long-every``-th row is long
(half to all of ``--seq-len``), rows in random order, so nearly every padded
micro-batch holds a long row and is padded to it. The two engines start from the
same weights and take their steps alternately (padded, packed, padded, ...), so
both see the same load; the last line is one JSON object with the ratio.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time

import click

from asyncflow.bench import flops
from asyncflow.bench.shared_inputs import bench_tiny_model, model_option


def _batch(num_rows: int, seq_len: int, seed: int = 0):
    import torch

    from asyncflow.engines.base import TokenBatch

    g = torch.Generator().manual_seed(seed)
    ids_BT = torch.randint(6, 90, (num_rows, seq_len), generator=g)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (num_rows,), generator=g)
    attn_BT = (torch.arange(seq_len).unsqueeze(0) < lengths.unsqueeze(1)).long()
    resp_BT = attn_BT.float()
    resp_BT[:, : seq_len // 4] = 0.0
    adv_BT = torch.randn(num_rows, 1, generator=g) * resp_BT
    return TokenBatch(
        input_ids=ids_BT, attention_mask=attn_BT, response_mask=resp_BT, advantages=adv_BT, rollout_logp=-2.0 * resp_BT
    )


def _long_tailed_batch(num_rows: int, seq_len: int, long_every: int, seed: int = 0):
    import torch

    from asyncflow.engines.batching import make_token_batch

    g = torch.Generator().manual_seed(seed)
    prompt_len = max(seq_len // 8, 2)
    short_max = max(seq_len // 8, 2)
    prompts, responses = [], []
    for b in torch.randperm(num_rows, generator=g).tolist():
        if b % long_every == 0:
            n = int(torch.randint(seq_len // 2 - prompt_len, seq_len - prompt_len + 1, (1,), generator=g))
        else:
            n = int(torch.randint(1, short_max + 1, (1,), generator=g))
        prompts.append(torch.randint(6, 90, (prompt_len,), generator=g).tolist())
        responses.append(torch.randint(6, 90, (max(n, 1),), generator=g).tolist())
    rollout = [[-2.0] * len(r) for r in responses]
    advantages_B = torch.randn(num_rows, generator=g)
    return make_token_batch(prompts, responses, pad_token_id=0, rollout_logprobs=rollout, advantages_B=advantages_B)


def _packing_side_by_side(model_dir: str, num_rows, seq_len, micro_batch_size, steps, long_every) -> dict:
    """Padded and packed engines over the same long-tailed batch, steps alternating."""
    from asyncflow.algorithms.grpo import PolicyLossConfig, policy_loss_fn
    from asyncflow.engines.config import TrainEngineConfig
    from asyncflow.engines.factory import build_train_engine

    batch = _long_tailed_batch(num_rows, seq_len, long_every)
    loss_fn = policy_loss_fn(PolicyLossConfig())
    engines = {
        packing: build_train_engine(TrainEngineConfig(lr=1e-4, micro_batch_size=micro_batch_size, packing=packing), model_dir)
        for packing in (False, True)
    }
    for engine in engines.values():
        engine.train_step(batch, loss_fn)  # warm-up
    seconds = {packing: 0.0 for packing in engines}
    fed = {packing: 0 for packing in engines}  # tokens (real and padding) through the model
    losses: dict[bool, list[float]] = {packing: [] for packing in engines}
    for _ in range(steps):
        for packing, engine in engines.items():
            start = time.perf_counter()
            result = engine.train_step(batch, loss_fn)
            seconds[packing] += time.perf_counter() - start
            losses[packing].append(result.loss)
            fed[packing] += result.num_fed_tokens
    real = int(batch.attention_mask.sum()) * steps
    return {
        "real_tokens": real,
        "seconds": seconds,
        "fed_tokens": fed,
        "max_loss_diff": max(abs(a - b) for a, b in zip(losses[False], losses[True])),
        "pack_attention": getattr(engines[True], "pack_attention", None),  # the torch engine's path
        "lengths": batch.attention_mask.sum(dim=1).tolist(),
    }


def _time_steps(engine, batch, steps: int) -> float:
    from asyncflow.algorithms.grpo import PolicyLossConfig, policy_loss_fn

    loss_fn = policy_loss_fn(PolicyLossConfig())
    engine.train_step(batch, loss_fn)  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        engine.train_step(batch, loss_fn)
    return time.perf_counter() - start


def _fsdp_worker(rank: int, world: int, port: int, model_dir: str, args: dict, out_path: str) -> None:
    import torch

    torch.set_num_threads(1)
    from asyncflow.engines.config import TrainEngineConfig
    from asyncflow.engines.device import init_process_group
    from asyncflow.engines.factory import build_train_engine

    init_process_group("cpu", rank, world, "127.0.0.1", port)
    engine = build_train_engine(TrainEngineConfig(lr=1e-4, micro_batch_size=args["micro_batch_size"], fsdp=True), model_dir)
    full = _batch(args["num_rows"], args["seq_len"])
    shard = full.split(args["num_rows"] // world)[rank]
    seconds = _time_steps(engine, shard, args["steps"])
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"seconds": seconds}, f)
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@click.command("train")
@click.option("--num-rows", default=32, show_default=True, help="Sequences per global batch.")
@click.option("--seq-len", default=96, show_default=True)
@click.option("--micro-batch-size", default=8, show_default=True)
@click.option("--steps", default=5, show_default=True)
@click.option("--hidden-size", default=128, show_default=True)
@click.option("--num-layers", default=4, show_default=True)
@model_option("--hidden-size and --num-layers are then ignored")
@click.option("--threads", default=1, show_default=True, help="Intra-op threads of the one-process run.")
@click.option(
    "--packing", is_flag=True, help="Sequence packing on vs off, one process, on a long-tailed batch (prints one JSON line)."
)
@click.option("--long-every", default=8, show_default=True, help="--packing: every n-th row has a long response.")
@click.option(
    "--share-prompts",
    is_flag=True,
    help="train.engine.share_prompts off vs on, one process, on groups of --group-size rows sharing a "
    "--prompt-len-token prompt (prints one JSON line; with --autocast under bfloat16 autocast).",
)
@click.option("--group-size", default=8, show_default=True, help="--share-prompts: rows per prompt.")
@click.option("--prompt-len", default=48, show_default=True, help="--share-prompts and --config: tokens per prompt.")
@click.option(
    "--autocast",
    is_flag=True,
    help="Also one process with bfloat16 autocast (train.engine.autocast): its tokens/s beside float32's, same batch.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A run's config (e.g. examples/smollm2.toml): its trainer (train.engine) on its model and a batch of its "
    "step's shape (--prompt-len-token prompts), against the bfloat16 matmul peak, with the three places the rest of a "
    "step goes (bench/_train_peak.py; prints one JSON line). Other options but --steps and --prompt-len are ignored.",
)
@click.option("--set", "overrides", multiple=True, help="--config: KEY=VALUE overrides, as afctl up takes them.")
@click.option(
    "--baseline",
    multiple=True,
    help="--config: a train.engine KEY=VALUE of a second trainer whose steps alternate with the config's "
    "(e.g. --baseline micro_batch_tokens=0 --baseline logit_chunk=0); its step time and the speedup.",
)
@click.option("--json", "as_json", is_flag=True, help="Last line: one JSON object.")
def train(
    num_rows,
    seq_len,
    micro_batch_size,
    steps,
    hidden_size,
    num_layers,
    model_path,
    threads,
    packing,
    long_every,
    share_prompts,
    group_size,
    prompt_len,
    autocast,
    config_path,
    overrides,
    baseline,
    as_json,
):
    """Training tokens/s: one process vs two-process FSDP2 (--packing: packing on vs off)."""
    import torch
    import torch.multiprocessing as mp

    from asyncflow.engines.config import TrainEngineConfig
    from asyncflow.engines.factory import build_train_engine

    if config_path is not None:
        from asyncflow.bench import _train_peak

        if model_path is not None:  # --model stands for the config's model.path
            overrides = (*overrides, f"model.path={json.dumps(str(model_path))}")
        _train_peak.run(config_path, tuple(overrides), tuple(baseline), prompt_len, steps)
        return
    world = 2
    label = f"hidden {hidden_size} x {num_layers} layers"
    model_dir = model_path or str(bench_tiny_model("bench_train_", hidden_size, num_layers))
    torch.set_num_threads(threads)
    if share_prompts:
        from asyncflow.bench import _train_shared
        from asyncflow.engines.hf import load_config

        vocab = min(int(load_config(model_dir).get_text_config().vocab_size), 50_000)
        batch = _train_shared.grouped_batch(num_rows, group_size, prompt_len, seq_len, vocab)
        run = _train_shared.side_by_side(model_dir, batch, micro_batch_size, steps, autocast)
        model = label if model_path is None else model_path
        _train_shared.report(run, batch, steps, threads, model, group_size, prompt_len, autocast)
        return
    if packing:
        _report_packing(
            _packing_side_by_side(model_dir, num_rows, seq_len, micro_batch_size, steps, long_every),
            steps=steps,
            threads=threads,
            model=label if model_path is None else model_path,
            micro_batch_size=micro_batch_size,
        )
        return
    batch = _batch(num_rows, seq_len)
    tokens = int(batch.attention_mask.sum()) * steps
    figures = {}
    engine = build_train_engine(TrainEngineConfig(lr=1e-4, micro_batch_size=micro_batch_size), model_dir)
    num_params = sum(p.numel() for p in engine.net.lm.parameters())  # tied weights once: the head's matmul
    seconds = _time_steps(engine, batch, steps)
    figures["one_process_tokens_per_s"] = tokens / seconds
    peak = {"float32": flops.matmul_peak("float32")}  # measured now, with the training's threads
    figures["train_flops"], figures["of_float32_peak"] = flops.of_peak(num_params, tokens, seconds, peak["float32"])
    click.echo(
        f"one process, {threads} thread(s): {tokens / seconds:.0f} tokens/s ({seconds / steps * 1000:.0f} ms/step), "
        f"{figures['train_flops'] / 1e12:.3f} TFLOP/s = {figures['of_float32_peak']:.0%} of a float32 matmul's "
        f"{peak['float32'] / 1e12:.3f} (6 x {num_params / 1e6:.1f} M parameters x tokens)"
    )
    if autocast:
        del engine
        mixed = TrainEngineConfig(lr=1e-4, micro_batch_size=micro_batch_size, autocast="bfloat16")
        seconds = _time_steps(build_train_engine(mixed, model_dir), batch, steps)
        figures["autocast_tokens_per_s"] = tokens / seconds
        peak["bfloat16"] = flops.matmul_peak("bfloat16")
        figures["autocast_flops"], figures["of_bfloat16_peak"] = flops.of_peak(num_params, tokens, seconds, peak["bfloat16"])
        click.echo(
            f"one process, bfloat16 autocast: {tokens / seconds:.0f} tokens/s ({seconds / steps * 1000:.0f} ms/step), "
            f"{figures['autocast_tokens_per_s'] / figures['one_process_tokens_per_s']:.2f}x float32; "
            f"{figures['autocast_flops'] / 1e12:.3f} TFLOP/s = {figures['of_bfloat16_peak']:.0%} of a bfloat16 matmul's "
            f"{peak['bfloat16'] / 1e12:.3f}"
        )

    out_path = os.path.join(tempfile.mkdtemp(prefix="bench_train_fsdp_"), "fsdp.json")
    args = {"num_rows": num_rows, "seq_len": seq_len, "micro_batch_size": micro_batch_size, "steps": steps}
    mp.spawn(_fsdp_worker, args=(world, _free_port(), model_dir, args, out_path), nprocs=world, join=True)
    with open(out_path) as f:
        seconds = json.load(f)["seconds"]
    figures["fsdp2_tokens_per_s"] = tokens / seconds
    click.echo(
        f"FSDP2, {world} processes x 1 thread (gloo): {tokens / seconds:.0f} tokens/s ({seconds / steps * 1000:.0f} ms/step)"
    )
    ratio = figures["fsdp2_tokens_per_s"] / figures["one_process_tokens_per_s"]
    click.echo(
        f"FSDP2 / one process: {ratio:.2f} (model {label if model_path is None else model_path}, "
        f"global batch {num_rows} x {seq_len}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )
    if as_json:
        click.echo(
            json.dumps(
                {
                    "tokens_per_s": round(figures["one_process_tokens_per_s"], 1),
                    "one_process_threads": threads,
                    "num_params": num_params,
                    "train_tflops": round(figures["train_flops"] / 1e12, 4),
                    "float32_peak_tflops": round(peak["float32"] / 1e12, 4),
                    "of_float32_peak": round(figures["of_float32_peak"], 4),
                    "fsdp2_tokens_per_s": round(figures["fsdp2_tokens_per_s"], 1),
                    "fsdp2_processes": world,
                    "ratio_fsdp2_to_one_process": round(ratio, 3),
                    "load_average": round(os.getloadavg()[0], 2),
                    **(
                        {
                            "autocast_tokens_per_s": round(figures["autocast_tokens_per_s"], 1),
                            "ratio_autocast_to_float32": round(
                                figures["autocast_tokens_per_s"] / figures["one_process_tokens_per_s"], 3
                            ),
                            "autocast_tflops": round(figures["autocast_flops"] / 1e12, 4),
                            "bfloat16_peak_tflops": round(peak["bfloat16"] / 1e12, 4),
                            "of_bfloat16_peak": round(figures["of_bfloat16_peak"], 4),
                        }
                        if autocast
                        else {}
                    ),
                }
            )
        )


def _report_packing(run: dict, steps: int, threads: int, model: str, micro_batch_size: int) -> None:
    lengths = run["lengths"]
    rate = {packing: run["real_tokens"] / run["seconds"][packing] for packing in (False, True)}
    ratio = rate[True] / rate[False]
    load = os.getloadavg()[0]
    for packing, name in ((False, "padded"), (True, "packed")):
        click.echo(
            f"{name}: {rate[packing]:.0f} tokens/s ({run['seconds'][packing] / steps * 1000:.0f} ms/step), "
            f"{run['fed_tokens'][packing] // steps} tokens through the model per step"
        )
    click.echo(
        f"packed / padded: {ratio:.2f} (model {model}, {len(lengths)} rows of {min(lengths)}-{max(lengths)} tokens, "
        f"mean {sum(lengths) / len(lengths):.0f}, micro-batch {micro_batch_size}, {threads} thread(s); attention kept "
        f"within sequences by {run['pack_attention']}; largest loss difference {run['max_loss_diff']:.1e}; "
        f"load average {load:.1f} on {os.cpu_count()} cores)"
    )
    click.echo(
        json.dumps(
            {
                "padded_tokens_per_s": round(rate[False], 1),
                "packed_tokens_per_s": round(rate[True], 1),
                "ratio_packed_to_padded": round(ratio, 3),
                "padded_fed_tokens_per_step": run["fed_tokens"][False] // steps,
                "packed_fed_tokens_per_step": run["fed_tokens"][True] // steps,
                "real_tokens_per_step": run["real_tokens"] // steps,
                "pack_attention": run["pack_attention"],
                "max_loss_diff": run["max_loss_diff"],
                "steps": steps,
                "threads": threads,
                "load_average": round(load, 2),
            }
        )
    )
