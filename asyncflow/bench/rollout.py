"""``afctl bench rollout``: the native rollout engine against Hugging Face
``generate`` (or, with ``--against vllm``, against the vLLM engine), side by side in
one process on the same tiny model, on ``--device``.

Same prompts (varying lengths), same sampling (temperature 1, no top-k/top-p), same
batch size, same max new tokens, same stop tokens (several, so response lengths
vary widely like real long-tail rollouts). HF ``generate`` runs the prompts in
static batches (each waits for its longest response); the native engine streams
them through continuous batching. Throughput counts generated tokens up to and
including the stop token, divided by wall time; each side gets a warm-up run, then
repetitions alternate and the median is reported. Against vLLM both engines stream
all prompts at once (continuous batching each), in ``--dtype``.
"""

from __future__ import annotations

import json
import random
import statistics
import time

import click

from asyncflow.bench.shared_inputs import bench_tiny_model, model_option


@click.command("rollout")
@click.option("--num-prompts", default=64, show_default=True)
@click.option("--batch-size", default=16, show_default=True)
@click.option("--max-new-tokens", default=64, show_default=True)
@click.option(
    "--samples-per-prompt",
    default=1,
    show_default=True,
    help="Samples drawn from each prompt (a GRPO group: the native engine runs a prompt once for all of its samples; "
    "HF generate runs each copy, as TRL's batches do).",
)
@click.option("--num-stop-tokens", default=6, show_default=True, help="Stop tokens (eos + others): more means shorter responses.")
@click.option("--hidden-size", default=128, show_default=True)
@click.option("--num-layers", default=4, show_default=True)
@model_option(
    "its --task prompts (chat-rendered where it has a template), its eos as the one stop token unless "
    "--stop-token-ids; --num-stop-tokens, --hidden-size and --num-layers are then ignored"
)
@click.option(
    "--task",
    default="add2",
    show_default=True,
    help="With --model: the built-in task whose prompts it draws (add2: examples/smollm2.toml's; add1: examples/gemma3.toml's).",
)
@click.option(
    "--stop-token-ids",
    default="",
    help="With --model: comma-separated stop tokens (a config's rollout.sampling.stop_token_ids, e.g. a base model's "
    "newlines); empty: the model's eos.",
)
@click.option("--repeats", default=3, show_default=True)
@click.option("--threads", default=1, show_default=True, help="torch intra-op threads.")
@click.option("--device", type=click.Choice(["cpu", "cuda", "npu"]), default="cpu", show_default=True)
@click.option(
    "--against",
    type=click.Choice(["hf", "vllm", "vllm_ascend"]),
    default="hf",
    show_default=True,
    help="The baseline: HF generate, or the vLLM engine (needs --device cuda, or npu for vllm_ascend).",
)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True)
@click.option(
    "--compile",
    "compile_",
    type=click.Choice(["auto", "on", "off"]),
    default="auto",
    show_default=True,
    help="The native engine's rollout.engine.compile (its decode step compiled; the warm-up run pays the compile of "
    "the graphs it meets). `afctl bench decode` times one decode step each way.",
)
@click.option(
    "--vllm-eager",
    is_flag=True,
    help="vLLM without torch.compile and CUDA graphs (starts in seconds; eager like the native engine).",
)
@click.option(
    "--profile",
    is_flag=True,
    help="After the timed repetitions, one more of each under torch.profiler: seconds by kind of operator "
    "(matmul, attention, kv_cache, sampling, other).",
)
@click.option("--json", "as_json", is_flag=True, help="Last line: one JSON object.")
def rollout(
    num_prompts,
    samples_per_prompt,
    batch_size,
    max_new_tokens,
    num_stop_tokens,
    hidden_size,
    num_layers,
    model_path,
    task,
    stop_token_ids,
    repeats,
    threads,
    device,
    against,
    dtype,
    compile_,
    vllm_eager,
    profile,
    as_json,
):
    """Native engine vs HF generate (or vLLM): tokens/s and ratio."""
    import torch

    from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
    from asyncflow.engines.device import torch_dtype
    from asyncflow.engines.factory import build_rollout_engine
    from asyncflow.engines.hf import load_model

    torch.set_num_threads(threads)
    if model_path:
        model_dir, prompts, stops, label, chat_template = _real_model_inputs(model_path, num_prompts, task)
        if stop_token_ids:
            stops = tuple(int(t) for t in stop_token_ids.split(","))
    else:
        model_dir = bench_tiny_model("bench_rollout_", hidden_size, num_layers)
        rng = random.Random(0)
        prompts = [[rng.randrange(6, 90) for _ in range(rng.randint(4, 24))] for _ in range(num_prompts)]
        stops = tuple([2] + list(range(60, 60 + num_stop_tokens - 1)))
        label = f"model hidden {hidden_size} x {num_layers} layers"
        task, chat_template = "", False
    params = SamplingParams(
        temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens, stop_token_ids=stops, n=samples_per_prompt
    )
    hf_prompts = [p for p in prompts for _ in range(samples_per_prompt)]  # a group: its prompt repeated

    if against != "hf" and device == "cpu":
        raise click.UsageError(f"--against {against} needs --device cuda (vllm) or npu (vllm_ascend)")
    native = build_rollout_engine(
        RolloutEngineConfig(device=device, dtype=dtype, max_batch_size=batch_size, kv_cache_bytes=256 * 2**20, compile=compile_),
        model_dir,
    )
    vllm_engine = None
    if against != "hf":
        vllm_engine = build_rollout_engine(
            RolloutEngineConfig(
                type=against,
                device=device,
                dtype=dtype,
                max_batch_size=batch_size,
                kv_cache_bytes=256 * 2**20,
                enforce_eager=vllm_eager,
            ),
            model_dir,
        )
    hf_model = load_model(model_dir, dtype=torch_dtype(dtype)).to(device) if against == "hf" else None  # the same dtype

    def run_native(seed: int) -> tuple[int, float]:
        start = time.perf_counter()
        out = native.generate(prompts, SamplingParams(**{**_fields(params), "seed": seed}))
        return sum(len(c.response_ids) for c in out), time.perf_counter() - start

    def run_vllm(seed: int) -> tuple[int, float]:
        assert vllm_engine is not None
        start = time.perf_counter()
        out = vllm_engine.generate(prompts, SamplingParams(**{**_fields(params), "seed": seed}))
        return sum(len(c.response_ids) for c in out), time.perf_counter() - start

    def run_hf(seed: int) -> tuple[int, float]:
        assert hf_model is not None
        torch.manual_seed(seed)
        start = time.perf_counter()
        tokens = 0
        for i in range(0, len(hf_prompts), batch_size):
            chunk = hf_prompts[i : i + batch_size]
            width = max(len(p) for p in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for b, p in enumerate(chunk):  # left padding, as HF generate wants
                ids[b, width - len(p) :] = torch.tensor(p)
                mask[b, width - len(p) :] = 1
            with torch.inference_mode():
                out = hf_model.generate(
                    input_ids=ids.to(device),
                    attention_mask=mask.to(device),
                    do_sample=True,
                    temperature=1.0,
                    top_p=1.0,
                    top_k=0,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=list(stops),
                    pad_token_id=0,
                )
            for row in out[:, width:].tolist():
                n = next((j + 1 for j, t in enumerate(row) if t in stops), len(row))
                tokens += n
        return tokens, time.perf_counter() - start

    run_base, base_name = (run_hf, "hf generate") if against == "hf" else (run_vllm, against + (" eager" if vllm_eager else ""))
    run_native(0), run_base(0)  # warm-up
    native_tps, hf_tps = [], []
    try:
        for r in range(repeats):
            n_tok, sec = run_native(r + 1)
            native_tps.append(n_tok / sec)
            h_tok, h_sec = run_base(r + 1)
            hf_tps.append(h_tok / h_sec)
            click.echo(
                f"repeat {r}: native {n_tok} tokens in {sec:.2f}s ({n_tok / sec:.0f} tok/s) | "
                f"{base_name} {h_tok} tokens in {h_sec:.2f}s ({h_tok / h_sec:.0f} tok/s)"
            )
    finally:
        if vllm_engine is not None:
            vllm_engine.close()
    breakdown = {}
    if profile:
        from asyncflow.bench._op_profile import op_breakdown

        breakdown = {
            "native": op_breakdown(lambda: run_native(repeats + 1)),
            "baseline": op_breakdown(lambda: run_base(repeats + 1)),
        }
        for who, parts in breakdown.items():
            click.echo(f"profile {who}: " + ", ".join(f"{k} {v:.2f}s" for k, v in parts.items()))
    tps, base = statistics.median(native_tps), statistics.median(hf_tps)
    click.echo(
        f"native {tps:.0f} tok/s vs {base_name} {base:.0f} tok/s: ratio {tps / base:.2f} "
        f"(prompts {num_prompts} x {samples_per_prompt} samples, batch {batch_size}, max_new_tokens {max_new_tokens}, threads {threads}, "
        f"device {device}, dtype {dtype}, {label})"
    )
    if as_json:
        click.echo(
            json.dumps(
                {
                    "tokens_per_s": round(tps, 1),
                    "baseline_tokens_per_s": round(base, 1),
                    "ratio": round(tps / base, 3),
                    "num_prompts": num_prompts,
                    "samples_per_prompt": samples_per_prompt,
                    "native_stats": _scheduler_stats(native),
                    "profile_s": breakdown,
                    "batch_size": batch_size,
                    "max_new_tokens": max_new_tokens,
                    "threads": threads,
                    "device": device,
                    "baseline": base_name,
                    "model": label,
                    "dtype": dtype,
                    "compile": compile_,
                    "native_compiled": getattr(native, "compiled", None) is not None,
                    "task": task,
                    "num_stop_tokens": len(stops),
                    "chat_template": chat_template,
                }
            )
        )


def _real_model_inputs(
    model_path: str, num_prompts: int, task: str = "add2"
) -> tuple[str, list[list[int]], tuple[int, ...], str, bool]:
    """A real model's directory, its ``task`` prompts (add2: the task of examples/smollm2.toml),
    rendered by its chat template where it has one (a base model such as Gemma 3 270M has
    none: plain text), its stop tokens, a label naming it, and whether the template rendered them."""
    from pathlib import Path

    from asyncflow.engines.hf import load_config, load_tokenizer
    from asyncflow.engines.prompts import prompt_ids
    from asyncflow.toy.tasks import make_examples

    tokenizer = load_tokenizer(model_path)
    config = load_config(model_path)
    chat = bool(getattr(tokenizer, "chat_template", None))
    prompts = [list(prompt_ids(tokenizer, ex["prompt"], chat)) for ex in make_examples(num_prompts, seed=0, task=task)]
    eos = config.eos_token_id if config.eos_token_id is not None else tokenizer.eos_token_id
    stops = tuple(eos) if isinstance(eos, list) else (int(eos),)
    label = (
        f"model {Path(model_path).name} ({config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"vocabulary {config.vocab_size})"
    )
    return model_path, prompts, stops, label, chat


def _scheduler_stats(engine) -> dict:
    """The native engine's scheduler counters of its last ``generate`` (prefill rows and tokens, decode steps)."""
    import dataclasses

    return dataclasses.asdict(engine.stats) if hasattr(engine, "stats") else {}


def _fields(params) -> dict:
    import msgspec

    return msgspec.structs.asdict(params)
