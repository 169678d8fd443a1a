"""``afctl bench prefix``: multi-turn conversations on the native engine with its prefix
cache on and off, side by side (``rollout.engine.prefix_cache``, engines/prefix_cache.py).

Each turn, every conversation's prompt is its history (the first prompt, then each
response followed by the next user message), all conversations in one ``generate`` as
an environment's turns or a gateway's requests arrive together. Greedy, so both modes
produce the same tokens and do the same work but for the prefill the cache serves; the
figures say whether they did. The weights stay fixed, as within one policy version (new
weights empty the cache)."""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time

import click

FOLLOW_UP = "\nNow add 7 to that. Answer with the number only.\n"
"""The next user message of a real model's conversation (its tokens, as text)."""


@click.command()
@click.option("--model", "model_path", default=None, help="A Hugging Face model directory (default: the tiny model).")
@click.option("--conversations", default=8, show_default=True)
@click.option("--turns", default=4, show_default=True)
@click.option("--max-new-tokens", default=24, show_default=True)
@click.option("--obs-tokens", default=16, show_default=True, help="Tiny model: tokens of each next user message.")
@click.option("--repeats", default=3, show_default=True)
@click.option("--threads", default=1, show_default=True, help="torch intra-op threads.")
@click.option("--json", "as_json", is_flag=True, help="Last line: one JSON object.")
def prefix(model_path, conversations, turns, max_new_tokens, obs_tokens, repeats, threads, as_json):
    """Multi-turn conversations with the prefix cache on vs off: time and prefill tokens."""
    import torch

    from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
    from asyncflow.engines.factory import build_rollout_engine

    torch.set_num_threads(threads)
    if model_path:
        from asyncflow.bench.rollout import _real_model_inputs
        from asyncflow.engines.hf import load_tokenizer

        model_dir, firsts, stops, label, _ = _real_model_inputs(model_path, conversations)
        follow = list(load_tokenizer(model_path).encode(FOLLOW_UP, add_special_tokens=False))
    else:
        from asyncflow.toy.tiny import make_tiny_model

        model_dir = make_tiny_model(tempfile.mkdtemp(prefix="bench_prefix_"), seed=0, hidden_size=128, num_layers=4)
        rng = random.Random(0)
        firsts = [[rng.randrange(6, 90) for _ in range(rng.randint(16, 40))] for _ in range(conversations)]
        follow = [rng.randrange(6, 90) for _ in range(obs_tokens)]
        stops, label = (), "tiny model, hidden 128 x 4 layers"
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=stops, n=1)
    engines = {
        mode: build_rollout_engine(
            RolloutEngineConfig(max_batch_size=max(conversations, 1), kv_cache_bytes=256 * 2**20, prefix_cache=on),
            model_dir,
        )
        for mode, on in (("cache", True), ("no_cache", False))
    }

    def run(mode: str) -> dict:
        engine = engines[mode]
        if engine.prefix is not None:
            engine.prefix.clear()  # each repeat starts cold, as a new policy version does
        history = [list(p) for p in firsts]
        prefill = cached = generated = 0
        start = time.perf_counter()
        for _ in range(turns):
            out = engine.generate(history, params)
            prefill += engine.stats.prefill_tokens
            cached += engine.stats.prefix_cached_tokens
            generated += sum(len(c.response_ids) for c in out)
            history = [h + c.response_ids + follow for h, c in zip(history, out)]
        return {
            "seconds": time.perf_counter() - start,
            "prefill_tokens": prefill,
            "cached_tokens": cached,
            "generated_tokens": generated,
            "final": history,
        }

    run("cache"), run("no_cache")  # warm-up
    results: dict[str, list[dict]] = {"cache": [], "no_cache": []}
    for r in range(repeats):
        order = ("cache", "no_cache") if r % 2 == 0 else ("no_cache", "cache")  # alternate: drift hits both
        for mode in order:
            results[mode].append(run(mode))
        on, off = results["cache"][-1], results["no_cache"][-1]
        click.echo(
            f"repeat {r}: cache {on['seconds']:.2f} s, {on['prefill_tokens']} prompt tokens run "
            f"({on['cached_tokens']} served) | no cache {off['seconds']:.2f} s, {off['prefill_tokens']} run"
        )
    on_s = statistics.median(x["seconds"] for x in results["cache"])
    off_s = statistics.median(x["seconds"] for x in results["no_cache"])
    on, off = results["cache"][-1], results["no_cache"][-1]
    same = all(a["final"] == b["final"] for a, b in zip(results["cache"], results["no_cache"]))
    click.echo(
        f"prefix cache: {on_s:.2f} s vs {off_s:.2f} s without: {off_s / on_s:.2f}x; prompt tokens run "
        f"{on['prefill_tokens']} vs {off['prefill_tokens']} ({on['cached_tokens']} served from the cache); "
        f"same tokens in both: {'yes' if same else 'NO'} ({conversations} conversations x {turns} turns, "
        f"up to {max_new_tokens} new tokens a turn, {threads} thread(s), {label})"
    )
    if as_json:
        click.echo(
            json.dumps(
                {
                    "seconds_cache": round(on_s, 3),
                    "seconds_no_cache": round(off_s, 3),
                    "speedup": round(off_s / on_s, 3),
                    "prefill_tokens_cache": on["prefill_tokens"],
                    "prefill_tokens_no_cache": off["prefill_tokens"],
                    "cached_tokens": on["cached_tokens"],
                    "generated_tokens": on["generated_tokens"],
                    "same_tokens": same,
                    "conversations": conversations,
                    "turns": turns,
                    "max_new_tokens": max_new_tokens,
                    "threads": threads,
                    "model": label,
                }
            )
        )
