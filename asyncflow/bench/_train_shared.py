"""``afctl bench train --share-prompts``: one process with ``train.engine.share_prompts``
off against on, on a GRPO-shaped batch: ``num_rows / group_size`` prompts of
``prompt_len`` tokens, each held by ``group_size`` rows whose responses run to
``seq_len`` (a quarter of them shorter: stopped early). The two engines start from the
same weights and take their steps alternately (off, on, off, ...), so both see the
same load; the last line is one JSON object with the ratio and the largest difference
between the two steps' losses (float rounding only: the same loss)."""

from __future__ import annotations

import json
import os
import time

import click


def grouped_batch(num_rows: int, group_size: int, prompt_len: int, seq_len: int, vocab: int, seed: int = 0):
    """Rows of ``num_rows / group_size`` prompts, each ``group_size`` times, in group order."""
    import torch

    from asyncflow.engines.batching import make_token_batch

    if num_rows % group_size or not 0 < prompt_len < seq_len:
        raise click.UsageError(
            f"--num-rows {num_rows} must be a multiple of --group-size {group_size}, and --prompt-len {prompt_len} "
            f"between 1 and --seq-len {seq_len} - 1"
        )
    g = torch.Generator().manual_seed(seed)
    longest = seq_len - prompt_len
    prompts, responses = [], []
    for _ in range(num_rows // group_size):
        prompt = torch.randint(6, vocab, (prompt_len,), generator=g).tolist()
        for k in range(group_size):
            n = longest if k % 4 else int(torch.randint(1, longest + 1, (1,), generator=g))
            prompts.append(prompt)
            responses.append(torch.randint(6, vocab, (n,), generator=g).tolist())
    rollout = [[-2.0] * len(r) for r in responses]
    advantages_B = torch.randn(num_rows, generator=g)
    return make_token_batch(prompts, responses, pad_token_id=0, rollout_logprobs=rollout, advantages_B=advantages_B)


def side_by_side(model_dir: str, batch, micro_batch_size: int, steps: int, autocast: bool) -> dict:
    """Seconds per configuration over ``steps`` alternating optimizer steps, after a warm-up each."""
    from asyncflow.algorithms.grpo import PolicyLossConfig, policy_loss_fn
    from asyncflow.engines.config import TrainEngineConfig
    from asyncflow.engines.factory import build_train_engine

    loss_fn = policy_loss_fn(PolicyLossConfig(clip_against="behaviour"))
    engines = {
        on: build_train_engine(
            TrainEngineConfig(
                lr=1e-6,
                micro_batch_size=micro_batch_size,
                share_prompts=on,
                autocast="bfloat16" if autocast else "off",
            ),
            model_dir,
        )
        for on in (False, True)
    }
    for engine in engines.values():
        engine.train_step(batch, loss_fn)  # warm-up
    seconds = {on: 0.0 for on in engines}
    losses: dict[bool, list[float]] = {on: [] for on in engines}
    for _ in range(steps):
        for on, engine in engines.items():
            start = time.perf_counter()
            losses[on].append(engine.train_step(batch, loss_fn).loss)
            seconds[on] += time.perf_counter() - start
    return {"seconds": seconds, "max_loss_diff": max(abs(a - b) for a, b in zip(losses[False], losses[True]))}


def report(run: dict, batch, steps: int, threads: int, model: str, group_size: int, prompt_len: int, autocast: bool) -> None:
    from asyncflow.engines.shared_prompts import plan_shared

    real = int(batch.attention_mask.sum())
    rate = {on: real * steps / run["seconds"][on] for on in (False, True)}
    ratio = rate[True] / rate[False]
    plan = plan_shared(batch)
    fed_shared = int(plan.prompt_mask_GP.sum() + plan.response_mask_BR.sum()) if plan is not None else real
    load = os.getloadavg()[0]
    for on, name in ((False, "every row whole"), (True, "shared prompts")):
        click.echo(f"{name}: {rate[on]:.0f} tokens/s ({run['seconds'][on] / steps * 1000:.0f} ms/step)")
    click.echo(
        f"shared / whole: {ratio:.2f} (model {model}, {batch.batch_size} rows: groups of {group_size} on "
        f"{prompt_len}-token prompts, {real} real tokens a step, {fed_shared} with each prompt once; "
        f"{'bfloat16 autocast' if autocast else 'float32'}, {threads} thread(s); largest loss difference "
        f"{run['max_loss_diff']:.1e}; load average {load:.1f} on {os.cpu_count()} cores)"
    )
    click.echo(
        json.dumps(
            {
                "whole_tokens_per_s": round(rate[False], 1),
                "shared_tokens_per_s": round(rate[True], 1),
                "ratio_shared_to_whole": round(ratio, 3),
                "real_tokens_per_step": real,
                "shared_tokens_per_step": fed_shared,
                "max_loss_diff": run["max_loss_diff"],
                "autocast": autocast,
                "steps": steps,
                "threads": threads,
                "load_average": round(load, 2),
            }
        )
    )
