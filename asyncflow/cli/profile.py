"""``afctl profile``: calibrate the planner's efficiency factors by running the real engines.

At a few small model sizes (tiny Qwen2 models built offline by
``asyncflow.engines.tiny``) it times, on one device (one core, one torch thread, on
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
from pathlib import Path

import click

# (hidden, layers, heads, kv heads, intermediate): around 0.1 M to 5 M parameters.
SIZES = [(64, 2, 4, 2, 192), (128, 4, 4, 2, 384), (256, 4, 8, 4, 768), (384, 6, 8, 4, 1152)]
QUICK_SIZES = SIZES[:2]


def _median_time(fn, repeats: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _measure(model_dir: Path, shape, repeats: int, device: str) -> list:
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
        iterations = max(rollout.stats.num_steps, 1)
        context = prompt_len + new_tokens / 2
        work = shape.num_params * DTYPE_BYTES + batch * shape.kv_bytes_per_token() * context
        points.append(Point(kind="decode", size=f"{size}, batch {batch}", work=work, time_s=max(full - only_prefill, 1e-9) / iterations,
                            flops=batch * shape.forward_flops_per_token(context), batch=batch,
                            num_layers=shape.num_layers))
    long_prompt = 128
    for batch in (4, 16):
        prompts = [[7 + (i + j) % 50 for j in range(long_prompt)] for i in range(batch)]
        t = _median_time(lambda: rollout.generate(prompts, SamplingParams(max_new_tokens=1, seed=0)), repeats)
        work = batch * shape.prefill_flops(long_prompt)
        points.append(Point(kind="prefill", size=f"{size}, {batch} x {long_prompt} tokens", work=work, time_s=t,
                            num_layers=shape.num_layers))
    rollout.close()

    seq_len = 64
    for batch in (4, 16):
        trainer = build_train_engine(TrainEngineConfig(device=device, micro_batch_size=batch, num_threads=1), model_dir)
        ids = torch.randint(7, 57, (batch, seq_len))
        mask = torch.ones((batch, seq_len), dtype=torch.long)
        response = torch.zeros((batch, seq_len))
        response[:, seq_len // 2:] = 1.0
        tb = TokenBatch(input_ids=ids, attention_mask=mask, response_mask=response)

        def loss_fn(out, mb, ctx):
            return -(out.logp * mb.response_mask).sum() / ctx.num_tokens, {}

        tokens = batch * seq_len
        t_train = _median_time(lambda: trainer.train_step(tb, loss_fn), repeats)
        points.append(Point(kind="train", size=f"{size}, {batch} x {seq_len}", time_s=t_train,
                            work=3 * tokens * shape.forward_flops_per_token(seq_len / 2)))
        t_fwd = _median_time(lambda: trainer.forward(tb), repeats)
        points.append(Point(kind="forward", size=f"{size}, {batch} x {seq_len}", time_s=t_fwd,
                            work=tokens * shape.forward_flops_per_token(seq_len / 2)))
    return points


def fit_profile(points: list, hardware) -> "object":
    """Fit each kind of point to (efficiency, overhead); kinds not measured keep defaults."""
    from asyncflow.planner.calibration import Efficiency, fit_max

    def pick(kind):
        chosen = [p for p in points if p.kind == kind]
        return [p.work for p in chosen], [p.time_s for p in chosen]

    fields = {}
    flops, bandwidth = hardware.peak_bf16_flops, hardware.memory_bandwidth_bytes_per_s
    prefill = [p for p in points if p.kind == "prefill"]
    if prefill:
        fields["prefill_flops"], (fields["prefill_overhead_s_per_layer"],) = fit_max(
            [p.work for p in prefill], [0.0] * len(prefill), [p.time_s for p in prefill], flops,
            overhead_columns=[[float(p.num_layers) for p in prefill]],
        )
    for kind, eff_name, overhead_name in (
        ("train", "train_flops", "train_overhead_s"),
        ("forward", "forward_flops", "forward_overhead_s"),
    ):
        work, times = pick(kind)
        if work:
            fields[eff_name], (fields[overhead_name],) = fit_max(work, [0.0] * len(work), times, flops)
    decode = [p for p in points if p.kind == "decode"]
    if decode:
        # Decode is bound by bandwidth or by compute (at the prefill efficiency), whichever is slower.
        compute_eff = fields.get("prefill_flops", Efficiency().prefill_flops)
        fields["decode_bandwidth"], overheads = fit_max(
            [p.work for p in decode], [p.flops / (compute_eff * flops) for p in decode], [p.time_s for p in decode],
            bandwidth, overhead_columns=[[1.0] * len(decode), [float(p.num_layers) for p in decode],
                                         [float(p.batch) for p in decode]],
        )
        fields["decode_overhead_s"], fields["decode_overhead_s_per_layer"], fields["decode_overhead_s_per_seq"] = overheads
    return Efficiency(**fields)


def fit_errors(points: list, eff, hardware) -> dict[str, float]:
    """Mean |predicted / measured - 1| per kind, with the fitted factors."""
    flops, bandwidth = hardware.peak_bf16_flops, hardware.memory_bandwidth_bytes_per_s

    def predict(p) -> float:
        if p.kind == "decode":
            compute = p.flops / (eff.prefill_flops * flops)
            return (eff.decode_overhead_s + p.num_layers * eff.decode_overhead_s_per_layer + p.batch * eff.decode_overhead_s_per_seq
                    + max(p.work / (eff.decode_bandwidth * bandwidth), compute))
        factor, overhead = {
            "prefill": (eff.prefill_flops, p.num_layers * eff.prefill_overhead_s_per_layer),
            "train": (eff.train_flops, eff.train_overhead_s),
            "forward": (eff.forward_flops, eff.forward_overhead_s),
        }[p.kind]
        return overhead + p.work / (factor * flops)

    errors: dict[str, list[float]] = {}
    for p in points:
        errors.setdefault(p.kind, []).append(abs(predict(p) / p.time_s - 1))
    return {k: sum(v) / len(v) for k, v in errors.items()}


CHECK_SIZE = (320, 5, 8, 4, 960)  # between the fitted sizes, not one of them


def check_step(model_dir: Path, shape, eff, hw, device: str, repeats: int) -> dict[str, tuple[float, float]]:
    """One colocated GRPO-like step on one device with the real engines: generate, reference
    forward, train step. Returns phase -> (predicted s, measured s)."""
    import torch

    from asyncflow.engines.base import TokenBatch
    from asyncflow.engines.config import RolloutEngineConfig, SamplingParams, TrainEngineConfig
    from asyncflow.engines.factory import build_rollout_engine, build_train_engine
    from asyncflow.planner.cost import Workload, forward_cost, rollout_cost, train_cost

    prompts_n, samples, prompt_len, new_tokens = 8, 4, 16, 48
    seqs, seq_len = prompts_n * samples, prompt_len + new_tokens
    wl = Workload(prompt_len_tokens=prompt_len, response_len_tokens=new_tokens, max_response_len_tokens=new_tokens,
                  prompts_per_step=prompts_n, samples_per_prompt=samples, train_micro_batch_tokens=seqs * seq_len)
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
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda", "npu"]), help="Where the engines run.")
@click.option("--quick", is_flag=True, help="Two small sizes only (a few seconds).")
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed repetitions per measurement (median kept).")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Then predict and time one step of a held-out model size with the fitted factors.")
def profile(out_path, hardware, device, quick, repeats, check) -> None:
    """Calibrate the planner: time the real engines at small sizes and fit efficiency factors.

    Then: afctl plan --profile FILE ...
    """
    from asyncflow.engines.tiny import make_tiny_model
    from asyncflow.planner.calibration import Profile, save_profile
    from asyncflow.planner.hardware import get_hardware
    from asyncflow.planner.models import from_hf_config

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        hw = get_hardware(hardware)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    points = []
    with tempfile.TemporaryDirectory(prefix="afctl-profile-") as tmp:
        for i, (hidden, layers, heads, kv_heads, inter) in enumerate(QUICK_SIZES if quick else SIZES):
            model_dir = make_tiny_model(Path(tmp) / f"m{i}", hidden_size=hidden, num_layers=layers, num_heads=heads,
                                        num_kv_heads=kv_heads, intermediate_size=inter)
            shape = from_hf_config(model_dir)
            click.echo(f"profiling {shape.num_params / 1e6:.2f} M params (hidden {hidden}, {layers} layers) ...", err=True)
            points += _measure(model_dir, shape, repeats, device)
    eff = fit_profile(points, hw)
    errors = fit_errors(points, eff, hw)
    prof = Profile(
        hardware=hw.name, efficiency=eff, points=points,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        notes=f"afctl profile on {device}, one torch thread per device, tiny Qwen2 models; work in planner units (bf16 bytes); "
              f"mean fit error: " + ", ".join(f"{k} {v:.0%}" for k, v in errors.items()),
    )
    save_profile(prof, out_path)
    for name in ("prefill_flops", "decode_bandwidth", "train_flops", "forward_flops", "decode_overhead_s",
                 "decode_overhead_s_per_layer", "decode_overhead_s_per_seq", "prefill_overhead_s_per_layer", "train_overhead_s", "forward_overhead_s"):
        click.echo(f"  {name:20s} {getattr(eff, name):.4g}")
    click.echo("  mean fit error: " + ", ".join(f"{k} {v:.0%}" for k, v in errors.items()))
    click.echo(f"wrote {out_path} ({len(points)} measurements); use it with: afctl plan --profile {out_path}")
    if check:
        hidden, layers, heads, kv_heads, inter = CHECK_SIZE
        with tempfile.TemporaryDirectory(prefix="afctl-profile-check-") as tmp:
            model_dir = make_tiny_model(Path(tmp) / "check", hidden_size=hidden, num_layers=layers, num_heads=heads,
                                        num_kv_heads=kv_heads, intermediate_size=inter)
            shape = from_hf_config(model_dir)
            result = check_step(model_dir, shape, eff, hw, device, repeats)
        click.echo(f"check on a held-out size ({shape.num_params / 1e6:.2f} M params), 8 prompts x 4 samples, 16 + 48 tokens:")
        total_p = total_m = 0.0
        for phase, (pred, meas) in result.items():
            total_p, total_m = total_p + pred, total_m + meas
            click.echo(f"  {phase:18s} predicted {pred:7.3f} s  measured {meas:7.3f} s  error {pred / meas - 1:+.0%}")
        click.echo(f"  {'sync step':18s} predicted {total_p:7.3f} s  measured {total_m:7.3f} s  error {total_p / total_m - 1:+.0%}")
