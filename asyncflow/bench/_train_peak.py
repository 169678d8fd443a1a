"""``afctl bench train --config FILE``: the trainer of a run's config, on a batch of that
run's shape, against the machine's bfloat16 matmul peak, and where the rest of a step goes.

The engine is built from the config's ``train.engine`` (its micro-batching, autocast, threads,
chunked head) on the config's model; the batch is ``train.prompts_per_step`` groups of
``algorithm.group_size`` rows sharing a ``--prompt-len``-token prompt, with responses of up to
``rollout.sampling.max_new_tokens`` tokens (``_train_shared.grouped_batch``). After a warm-up
step, ``--steps`` timed optimizer steps; FLOP/s counted as 6 x parameters x real tokens
(``bench/flops.py``) against a square bfloat16 matmul timed with the same threads. With
``--baseline KEY=VALUE`` (repeatable) a second engine with those ``train.engine`` settings takes
the steps alternately with the first, so the two see the same load; the speedup is the median
of adjacent steps' ratios (on a shared machine one step's time moves with the load).

Where a step goes: one more step under ``torch.profiler``, each operator's own time put in a
place (``PLACES``): the matmuls' time beyond what the peak would take for the step's FLOPs, the
attention kernel, dtype casts and copies, the elementwise passes of the decoder (norms, rotary,
activations, residual adds), the log-softmax over the vocabulary, the optimizer, and what no
operator accounts for (Python, autograd's bookkeeping). The three largest are printed.
"""

from __future__ import annotations

import json
import os
import time

import click

PLACES: dict[str, tuple[str, ...]] = {
    "matmuls": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_weight_int4pack_mm"),
    "attention kernel": ("scaled_dot_product", "flash_attention"),
    "dtype casts and copies": ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::cat"),
    "log-softmax over the vocabulary": (
        "aten::logsumexp",
        "aten::_log_softmax",
        "aten::exp",
        "aten::gather",
        "aten::scatter_add",
        "aten::sub_",
    ),
    "optimizer and clipping": ("adamw", "aten::_foreach", "aten::linalg_vector_norm", "aten::norm"),
}
"""Operator names (substrings) by place; every other operator is an elementwise pass or a small op."""
ELEMENTWISE = "elementwise passes (norms, rotary, activations, residuals)"
UNACCOUNTED = "no operator (Python, autograd bookkeeping)"


def place_of(op: str) -> str:
    for place, names in PLACES.items():
        if any(n in op for n in names):
            return place
    return ELEMENTWISE


def profile_places(engine, batch, loss_fn, device: str = "cpu") -> tuple[float, dict[str, float]]:
    """One step's wall seconds and each place's seconds (operators' own time: on the main
    thread, or on the GPU with ``device`` cuda)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        engine.train_step(batch, loss_fn)
        _sync(device)
    wall = time.perf_counter() - start
    places: dict[str, float] = {}
    for event in prof.key_averages():
        seconds = (event.self_device_time_total if cuda else event.self_cpu_time_total) / 1e6
        if seconds > 0:
            places[place_of(event.key)] = places.get(place_of(event.key), 0.0) + seconds
    places[UNACCOUNTED] = max(wall - sum(places.values()), 0.0)
    return wall, places


def _sync(device: str) -> None:
    """Wait for the device's queued work (a step's time on cuda ends when its kernels do)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def run(config: str, overrides: tuple[str, ...], baseline: tuple[str, ...], prompt_len: int, steps: int) -> None:
    import torch

    from asyncflow.algorithms.grpo import PolicyLossConfig, policy_loss_fn
    from asyncflow.bench import _train_shared, flops
    from asyncflow.config.load import load_config
    from asyncflow.engines.factory import build_train_engine
    from asyncflow.engines.hf import load_config as load_model_config

    cfg = load_config(config, overrides)
    engine_cfg = cfg.train.engine
    threads = engine_cfg.num_threads or torch.get_num_threads()
    model_dir = str(cfg.model.path)
    vocab = min(int(load_model_config(model_dir).get_text_config().vocab_size), 50_000)
    rows, group = cfg.samples_per_step, cfg.algorithm.group_size
    batch = _train_shared.grouped_batch(rows, group, prompt_len, prompt_len + cfg.rollout.sampling.max_new_tokens, vocab)
    loss_fn = policy_loss_fn(PolicyLossConfig(clip_against="behaviour"))
    total = max(cfg.train.num_steps, steps + 2)  # the lr schedule's length: the warm-up, the timed and the profiled steps
    engines = {"config": build_train_engine(engine_cfg, model_dir, total_steps=total)}
    if baseline:
        engines["baseline"] = build_train_engine(
            load_config(config, overrides + tuple(f"train.engine.{b}" for b in baseline)).train.engine,
            model_dir,
            total_steps=total,
        )
    torch.set_num_threads(threads)
    for engine in engines.values():
        engine.train_step(batch, loss_fn)  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(steps):
        for name, engine in engines.items():
            start = time.perf_counter()
            engine.train_step(batch, loss_fn)
            _sync(engine_cfg.device)
            seconds[name].append(time.perf_counter() - start)
    num_params = sum(p.numel() for p in engines["config"].net.lm.parameters())  # type: ignore[attr-defined]  # the torch engine
    tokens = int(batch.attention_mask.sum())
    peak = flops.matmul_peak("bfloat16", device=engine_cfg.device)  # on the trainer's device, with its threads
    step = min(seconds["config"])
    achieved, of_peak = flops.of_peak(num_params, tokens, step, peak)
    wall, places = profile_places(engines["config"], batch, loss_fn, engine_cfg.device)
    ideal = flops.train_flops(num_params, tokens) / peak
    lost = dict(places)
    lost["matmuls below the peak"] = max(lost.pop("matmuls", 0.0) - ideal, 0.0)
    top = sorted(lost.items(), key=lambda kv: -kv[1])[:3]
    load = os.getloadavg()[0]
    autocast = getattr(engines["config"], "autocast", engine_cfg.autocast)
    click.echo(
        f"{config}: {rows} rows ({rows // group} prompts x {group}) of {prompt_len} + up to "
        f"{cfg.rollout.sampling.max_new_tokens} tokens, {tokens} real; autocast {autocast}, {threads} thread(s), "
        f"micro_batch_tokens {engine_cfg.micro_batch_tokens}, micro_batch_size {engine_cfg.micro_batch_size}, "
        f"logit_chunk {engine_cfg.logit_chunk}"
    )
    click.echo(
        f"step {step:.2f} s (best of {steps}): {achieved / 1e12:.3f} TFLOP/s = {of_peak:.0%} of a bfloat16 matmul's "
        f"{peak / 1e12:.3f} TFLOP/s (6 x {num_params / 1e6:.1f} M parameters x tokens; at the peak the step would take "
        f"{ideal:.2f} s)"
    )
    click.echo(f"profiled step {wall:.2f} s; the three places the rest goes:")
    for place, secs in top:
        click.echo(f"  {place}: {secs:.2f} s ({secs / wall:.0%} of the step)")
    result: dict = {
        "config": config,
        "rows": rows,
        "real_tokens": tokens,
        "threads": threads,
        "autocast": autocast,
        "micro_batch_tokens": engine_cfg.micro_batch_tokens,
        "logit_chunk": engine_cfg.logit_chunk,
        "step_s": round(step, 3),
        "train_tflops": round(achieved / 1e12, 4),
        "bfloat16_peak_tflops": round(peak / 1e12, 4),
        "of_bfloat16_peak": round(of_peak, 4),
        "ideal_step_s": round(ideal, 3),
        "profiled_step_s": round(wall, 3),
        "places": [{"place": p, "seconds": round(s, 3), "of_step": round(s / wall, 3)} for p, s in top],
        "steps": steps,
        "load_average": round(load, 2),
    }
    if baseline:
        base = min(seconds["baseline"])
        # each pair of adjacent steps saw about the same load: the median of their ratios
        pairs = sorted(b / c for b, c in zip(seconds["baseline"], seconds["config"]))
        speedup = pairs[len(pairs) // 2] if len(pairs) % 2 else (pairs[len(pairs) // 2 - 1] + pairs[len(pairs) // 2]) / 2
        result.update(
            baseline=list(baseline),
            baseline_step_s=round(base, 3),
            speedup_over_baseline=round(speedup, 3),
            step_seconds=[round(x, 2) for x in seconds["config"]],
            baseline_step_seconds=[round(x, 2) for x in seconds["baseline"]],
        )
        base_flops, base_of_peak = flops.of_peak(num_params, tokens, base, peak)
        result["baseline_of_bfloat16_peak"] = round(base_of_peak, 4)
        click.echo(
            f"baseline ({', '.join(baseline)}), steps alternating with the config's: {base:.2f} s = {base_of_peak:.0%} "
            f"of the peak; the config's step {speedup:.2f}x faster (the median of adjacent steps' ratios)"
        )
    click.echo(f"load average {load:.1f} on {os.cpu_count()} cores")
    click.echo(json.dumps(result))
