"""Regenerate docs/results.md and docs/performance.md: run each measuring command,
keep its JSON line, write the pages from those lines alone. No figure in a page is
typed by hand.

    python scripts/results.py                      # run what is missing, write docs/results.md
    python scripts/results.py --only parity        # rerun one section (its JSON is replaced)
    python scripts/results.py --render             # rewrite the pages from the JSON kept in --work
    python scripts/results.py --only breakdown peer ab ab_round2 ab_round3 ab_pin ab_call ab_seams micro   # docs/performance.md's sections

Each section's JSON line is kept with the command that produced it and when, in
``--work`` (default runs/results/<section>.json, with the runs) and in the repository
(docs/data/<section>.json: a fresh checkout renders the pages, and one section measured
again rewrites its page without measuring the others); a section without JSON is measured (unless
``--only`` names others), which takes about 12 minutes for docs/results.md's on a
2-core machine (the parity runs are most of it) plus about 30 and 40 for its
``dynamic_sampling`` and ``dynamic_sampling_sync`` sections (15 seeds x 2 runs each); its ``hub`` section needs
the ``openenv`` extra (``pip install -e '.[openenv]'``); about 13 for
docs/performance.md's (scripts/performance_page.py renders that page). The real-model sections
(``real_model``, ``real_lora_learning``, ``real_rollout``, ``real_rollout_bf16``, ``real_bf16_learning``, ``real_fp32_learning``,
``real_model_here`` (the example as shipped, on this CPU), ``real_threads`` (its thread layouts side by side),
``real_peer_here`` (it against TRL on both cores, on this CPU),
``real_rollout_distinct``, ``real_prefix`` (multi-turn, the prefix cache on vs off), ``real_train``, ``real_lora``,
``real_peer``, ``real_peer_seed1``, ``real_peer_seed2``, ``real_peer_trl2``,
``real_peer_seed3``, ``real_peer_seed4`` (TRL and async only), ``real_bf16_seed0`` to ``real_bf16_seed4`` (async
with its rollout in bfloat16), ``real_trl_lr_seed0`` to ``real_trl_lr_seed9`` (TRL at asyncflow's lr
schedule, and async), ``real_hfconv_seed0`` to ``real_hfconv_seed4`` (async at transformers' lr
schedule), ``real_paired_stream_seed0`` to ``real_paired_stream_seed19`` (async streamed and on-policy
against TRL, paired by data), ``real_paired_fp32_seed0`` to ``real_paired_fp32_seed9`` (the same, both trainers
in float32), ``real_stream``, ``real_stream_seed1``, ``real_stream_seed2``: docs/real-model.md, rendered by
scripts/real_model_page.py) are measured only when ``--only`` names them: they need
``models/smollm2-135m`` (README.md, "A real pretrained model") and take hours on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from real_model_page import DATA_DIR, PAIRED_STREAM_NUM_SEEDS, REAL  # noqa: E402

PY = sys.executable
BASE_REV = "b50b5b7"
"""The commit before the work of issue 13 (the "before" of docs/performance.md)."""
ROUND2_REV = "01f9339"
"""The commit before issue 13's second round (trainer prefetch, rewards scored in the rollout,
rows asked for while the weights travel)."""
ROUND3_REV = "19e0a5f"
"""The commit before issue 13's third round (the driver's stale sockets closed, no swap grant for a
replica alone, the trainer's metrics from a sender thread, the trainer pinned on an idle machine)."""
QUEUE_REV = "68294c9"  # main before the flat queue (issue 31, items 2 and 3)
SEAMS_REV = "0c2ee0c"
"""The commit before issue 32 (the seams refactor)."""

_ONE_ASYNC_RUN = [PY, "scripts/real_model_check.py", "--seeds", "0", "--modes", "async"]
"""One async run of examples/smollm2.toml, seed 0 (the real-model sections that change one thing)."""
_GROUP_ROLLOUT = [
    *(PY, "-m", "asyncflow.cli.main", "bench", "rollout", "--model", "models/smollm2-135m"),
    *("--num-prompts", "8", "--samples-per-prompt", "8", "--batch-size", "64", "--max-new-tokens", "24", "--repeats", "3"),
]
"""bench rollout on SmolLM2 as examples/smollm2.toml draws (8 prompts x 8 samples)."""

_GEMMA3_ROLLOUT = [
    *(PY, "-m", "asyncflow.cli.main", "bench", "rollout", "--model", "models/gemma3-270m", "--task", "add1"),
    *("--num-prompts", "8", "--samples-per-prompt", "8", "--batch-size", "64", "--max-new-tokens", "16", "--repeats", "3"),
]
"""bench rollout on Gemma 3 270M as examples/gemma3.toml draws (8 prompts x 8 samples, 16 new tokens), eos its one stop."""
_GEMMA3_STOPS = ",".join(
    str(t)
    for t in tomllib.loads((Path(__file__).resolve().parents[1] / "examples" / "gemma3.toml").read_text())["rollout"]["sampling"][
        "stop_token_ids"
    ]
)
"""examples/gemma3.toml's stop tokens (eos and the newlines): its responses end at the first line."""

_REAL_PEER = [PY, "-m", "asyncflow.cli.main", "bench", "peer", "--config", "examples/smollm2.toml", "--steps", "10"]
"""bench peer on SmolLM2 at the config's 10 steps."""
_STREAMED = [
    *("--set", "workflow.staleness=0", "--set", "workflow.stream_step=true", "--set", "rollout.prompts_per_call=2"),
]
"""async as a step streamed in parts, on-policy (``workflow.stream_step``, staleness 0, rollout calls of 2 prompts)."""
_DECOUPLED = ["--set", "algorithm.clip_against=proximal", "--set", "train.engine.share_prompts=true"]
"""async with the decoupled objective (the ratio against the trainer's policy) and each prompt once per micro-batch."""


def _paired(name: str, *overrides: str, seeds: int = 10) -> dict[str, list[str]]:
    """A set paired by data, seeds 0 to ``seeds`` - 1: per seed one bench peer invocation, TRL then async
    (``overrides`` apply to the config of both; bench peer gives TRL what maps to it) on the same prompt order."""
    return {
        f"{name}_seed{seed}": [
            *_REAL_PEER,
            *("--set", f"seed={seed}", "--set", f"rollout.engine.seed={seed}", "--set", f"data.order_seed={seed}"),
            *overrides,
            *("--skip-sync", "--trl-threads", "2", "--json", "--out", f"{{work}}/{name}_seed{seed}"),
        ]
        for seed in range(seeds)
    }


MORE_SEEDS = (3, 4)
"""Seeds of bench peer beyond 0-2, TRL and async only: one seed's comparison moves by up to 0.15 (docs/real-model.md)."""

SECTIONS: dict[str, list[str]] = {
    "parity": [PY, "scripts/convergence_parity.py", "--seeds", "0", "1", "2", "--out", "{work}/parity"],
    "agent": [PY, "examples/agent/measure.py", "--out", "{work}/agent"],
    # gateway sessions over 2 and 4 replicas, sticky vs round robin: prefix reuse and what the prefix cache served
    "sticky": [PY, "scripts/bench_sticky.py", "--replicas", "2,4", "--json"],
    # an environment of another library (OpenEnv, through envs/hub/openenv.py) trains the tiny model: the openenv extra
    "hub": [PY, "examples/hub/measure.py", "--out", "{work}/hub"],
    # async as a step streamed in parts at staleness 0 (workflow.stream_step): on-policy, learning as sync's
    "parity_stream": [
        *(PY, "scripts/convergence_parity.py", "--seeds", "0", "1", "2", "--modes", "async"),
        *("--set", "workflow.staleness=0", "--set", "workflow.stream_step=true"),
        *("--set", "rollout.prompts_per_call=4", "--set", "train.engine.micro_batch_size=32"),
        *("--out", "{work}/parity_stream"),
    ],
    "objective": [
        PY,
        "scripts/convergence_parity.py",
        "--seeds",
        "0",
        "1",
        "2",
        "--modes",
        "async",
        "--set",
        "algorithm.clip_against=proximal",
        "--out",
        "{work}/objective",
    ],
    "e2e": [
        PY,
        "-m",
        "asyncflow.cli.main",
        "bench",
        "e2e",
        "--config",
        "examples/local.toml",
        "--steps",
        "100",
        "--json",
        "--out",
        "{work}/e2e",
    ],
    "e2e_k2": [
        PY,
        "-m",
        "asyncflow.cli.main",
        "bench",
        "e2e",
        "--config",
        "examples/local.toml",
        "--steps",
        "100",
        "--staleness",
        "2",
        "--json",
        "--out",
        "{work}/e2e_k2",
    ],
    "queue": [PY, "-m", "asyncflow.cli.main", "bench", "queue", "-B", "8", "-L", "64", "-n", "300", "--compare-inline", "--json"],
    "train": [PY, "-m", "asyncflow.cli.main", "bench", "train", "--json"],
    "packing": [PY, "-m", "asyncflow.cli.main", "bench", "train", "--packing", "--steps", "10", "--json"],
    # issue 29: GRPO, GSPO, CISPO, Dr. GRPO, RLOO, REINFORCE++ (and its baseline variant) on examples/local.toml,
    # 3 seeds each, async as shipped: about 20 minutes on 2 cores
    "algorithms": [PY, "scripts/algorithms_check.py", "--seeds", "0", "1", "2", "--out", "{work}/algorithms"],
    # issue 16's target, examples/local.toml with and without dynamic sampling over 15 seeds: about 30 minutes
    # (async) and 40 (sync: no staleness on either side, every run deterministic) on 2 cores; runs whose
    # directory already holds a summary.json are read, not rerun
    **{
        f"dynamic_sampling{suffix}": [
            PY,
            "scripts/dynamic_sampling_check.py",
            "--mode",
            mode,
            "--seeds",
            *[str(seed) for seed in range(15)],
            "--out",
            f"{{work}}/dynamic_sampling{suffix}",
        ]
        for mode, suffix in (("async", ""), ("sync", "_sync"))
    },
    # docs/real-model.md, "A second family": Gemma 3 270M (base), imported into models/gemma3-270m first
    "gemma3_model": [
        *(PY, "scripts/real_model_check.py", "--config", "examples/gemma3.toml", "--seeds", "0", "1", "--modes", "async"),
        *("--out", "{work}/gemma3_model"),
    ],
    "gemma3_rollout": [*_GEMMA3_ROLLOUT, "--stop-token-ids", _GEMMA3_STOPS, "--json"],
    "gemma3_rollout_eos": [*_GEMMA3_ROLLOUT, "--profile", "--json"],  # every row to the cap: the LM head's share
    # docs/real-model.md (scripts/real_model_page.py): SmolLM2-135M, imported into models/smollm2-135m first
    "real_model": [
        PY,
        "scripts/real_model_check.py",
        "--seeds",
        "0",
        "1",
        "--modes",
        "async",
        "sync",
        "--out",
        "{work}/real_model",
    ],
    "real_lora_learning": [  # the same task with LoRA rank 8 (adapters learn at 10x the full model's lr)
        *_ONE_ASYNC_RUN,
        "--set",
        "train.engine.lora.rank=8",
        "--set",
        "train.engine.lr=2e-4",
        "--out",
        "{work}/real_lora_learning",
    ],
    # issue 29's losses and estimators on the real model: the issue's 6 algorithms x 3 seeds, async, about 5 min a run
    "real_algorithms": [
        *(PY, "scripts/algorithms_check.py", "--config", "examples/smollm2.toml", "--rollout-seed"),
        *("--only", "GRPO", "GSPO", "CISPO", "Dr. GRPO", "RLOO", "REINFORCE++"),
        *("--seeds", "0", "1", "2", "--out", "{work}/real_algorithms"),
    ],
    "real_rollout": [*_GROUP_ROLLOUT, "--profile", "--json"],
    "real_rollout_bf16": [*_GROUP_ROLLOUT, "--dtype", "bfloat16", "--json"],  # a CPU with avx512_bf16 or AMX
    "real_model_here": [  # the example as shipped on the CPU this runs on (its heading names it), one async seed
        *_ONE_ASYNC_RUN,
        "--out",
        "{work}/real_model_here",
    ],
    "real_threads": [  # how the example's processes share the 2 cores: thread layouts side by side (about 20 min)
        *(PY, "scripts/threads_check.py", "--config", "examples/smollm2.toml", "--steps", "4", "--json"),
    ],
    "real_bf16_learning": [  # the task with the rollout in bfloat16 too (the trainer: the example's mixed precision)
        *_ONE_ASYNC_RUN,
        "--set",
        "rollout.engine.dtype=bfloat16",
        "--out",
        "{work}/real_bf16_learning",
    ],
    "real_fp32_learning": [  # the task in float32 throughout (no autocast): what mixed precision saves, and costs
        *_ONE_ASYNC_RUN,
        "--set",
        "train.engine.autocast=off",
        "--out",
        "{work}/real_fp32_learning",
    ],
    "real_rollout_distinct": [  # the same with one sample per prompt: no group to share a prefill
        PY,
        "-m",
        "asyncflow.cli.main",
        "bench",
        "rollout",
        "--model",
        "models/smollm2-135m",
        "--num-prompts",
        "64",
        "--batch-size",
        "64",
        "--max-new-tokens",
        "24",
        "--repeats",
        "3",
        "--json",
    ],
    # train.engine.share_prompts off vs on, one trainer step of examples/smollm2.toml's shape: 8 prompts of 46 tokens
    # (the chat template's) x 8 samples of up to 16 tokens, micro-batches of 16 rows, bfloat16 autocast, both cores
    # transparent huge pages for torch's CPU tensors off vs on (THP_MEM_ALLOC_ENABLE), interleaved: the trainer and the
    # rollout engine on SmolLM2, then whole async runs of examples/smollm2.toml (about 20 min)
    "real_huge_pages": [
        *(PY, "scripts/huge_pages_ab.py", "--rounds", "2", "--run-steps", "4", "--json"),
        *("--out", "{work}/real_huge_pages"),
    ],
    "real_share_prompts": [
        *(PY, "-m", "asyncflow.cli.main", "bench", "train", "--model", "models/smollm2-135m", "--share-prompts"),
        *("--num-rows", "64", "--group-size", "8", "--prompt-len", "46", "--seq-len", "62", "--micro-batch-size", "16"),
        *("--autocast", "--threads", "2", "--steps", "3", "--json"),
    ],
    "real_train": [
        PY,
        "-m",
        "asyncflow.cli.main",
        "bench",
        "train",
        "--model",
        "models/smollm2-135m",
        "--num-rows",
        "16",
        "--seq-len",
        "64",
        "--micro-batch-size",
        "8",
        "--steps",
        "2",
        "--autocast",
        "--json",
    ],
    # multi-turn conversations on SmolLM2, the native engine's prefix cache on vs off (rollout.engine.prefix_cache)
    "real_prefix": [
        *(PY, "-m", "asyncflow.cli.main", "bench", "prefix", "--model", "models/smollm2-135m", "--repeats", "3"),
        "--json",
    ],
    "real_lora": [
        PY,
        "-m",
        "asyncflow.cli.main",
        "bench",
        "lora",
        "--model",
        "models/smollm2-135m",
        "--rank",
        "8",
        "--repeats",
        "3",
        "--json",
    ],
    "real_peer": [*_REAL_PEER, "--json", "--out", "{work}/real_peer"],
    # a second seed: TRL's (its sampling and data order) and asyncflow's rollout sampler (rollout.engine.seed: the
    # global seed does not reach it); data.seed stays, so that the held-out prompts are the same
    "real_peer_seed1": [
        *_REAL_PEER,
        "--set",
        "seed=1",
        "--set",
        "rollout.engine.seed=1",
        "--json",
        "--out",
        "{work}/real_peer_seed1",
    ],
    "real_peer_seed2": [
        *_REAL_PEER,
        "--set",
        "seed=2",
        "--set",
        "rollout.engine.seed=2",
        "--json",
        "--out",
        "{work}/real_peer_seed2",
    ],
    # more seeds of the accuracy comparison, TRL and the example's async only (sync has its 3 seeds above);
    # TRL on both cores: an accuracy-only run (its samples/s at 1 thread are the 3 seeds above)
    **{
        f"real_peer_seed{seed}": [
            *_REAL_PEER,
            *("--set", f"seed={seed}", "--set", f"rollout.engine.seed={seed}"),
            *("--skip-sync", "--trl-threads", "2", "--json", "--out", f"{{work}}/real_peer_seed{seed}"),
        ]
        for seed in MORE_SEEDS
    },
    # the example's async with its rollout in bfloat16 (rollout.engine.dtype), seeds 0-4, async only: TRL's accuracy
    # at each seed is the real_peer* sections'
    **{
        f"real_bf16_seed{seed}": [
            *_REAL_PEER,
            *(("--set", f"seed={seed}", "--set", f"rollout.engine.seed={seed}") if seed else ()),
            *("--set", "rollout.engine.dtype=bfloat16", "--skip-trl", "--skip-sync", "--json"),
            *("--out", f"{{work}}/real_bf16_seed{seed}"),
        ]
        for seed in (0, 1, 2, *MORE_SEEDS)
    },
    # TRL at asyncflow's lr at every step (bench/_peer_trl.py gives it asyncflow's schedule: warmup from lr / W,
    # where Hugging Face's starts at 0), then async, on the same code, seeds 0-9, TRL on both cores
    **{
        f"real_trl_lr_seed{seed}": [
            *_REAL_PEER,
            *("--set", f"seed={seed}", "--set", f"rollout.engine.seed={seed}"),
            *("--skip-sync", "--trl-threads", "2", "--json", "--out", f"{{work}}/real_trl_lr_seed{seed}"),
        ]
        for seed in range(10)
    },
    # paired by data: TRL reads the training prompts in asyncflow's order (bench/_peer_trl.in_asyncflows_order), and
    # each seed draws another order (data.order_seed) for both; TRL at asyncflow's lr, then async, seeds 0-9
    **_paired("real_paired"),
    # as real_paired, async with the decoupled objective (clip_against = "proximal": the ratio against the trainer's
    # policy, staleness corrected by min(pi_prox / mu, 2)) and each prompt once per micro-batch in training
    # (train.engine.share_prompts), seeds 0-9
    **_paired("real_paired_prox", *_DECOUPLED),
    # as real_paired_prox, async streamed and on-policy (workflow.stream_step at staleness 0, rollout calls of 2
    # prompts): no one-step lag behind TRL's on-policy samples, generation still overlapping training; seeds 0-19
    # (10-19 added to halve the variance of the mean difference: seeds 0-9 left it 1.2 standard errors below 0)
    **_paired("real_paired_stream", *_DECOUPLED, *_STREAMED, seeds=PAIRED_STREAM_NUM_SEEDS),
    # as real_paired_stream, both trainers in float32 (train.engine.autocast = "off"; bench peer then runs TRL
    # without bf16): pi / mu exactly 1 on both sides, the two systems the same algorithm up to sampling; seeds 0-9
    **_paired("real_paired_fp32", *_DECOUPLED, *_STREAMED, "--set", "train.engine.autocast=off"),
    # TRL, sync and async side by side on both cores with the settings of real_paired_prox (seed 0) as this code runs
    # them: the three systems' samples/s and held-out accuracy in one invocation
    "real_peer_prox": [
        *_REAL_PEER,
        *_DECOUPLED,
        *("--trl-threads", "2", "--json", "--out", "{work}/real_peer_prox"),
    ],
    # the example's async at transformers' lr schedule (train.engine.lr_schedule_convention = "huggingface"), the
    # schedule TRL trained with in the real_peer* sections: async only, seeds 0-4
    **{
        f"real_hfconv_seed{seed}": [
            *_REAL_PEER,
            *("--set", f"seed={seed}", "--set", f"rollout.engine.seed={seed}"),
            *("--set", "train.engine.lr_schedule_convention=huggingface", "--skip-trl", "--skip-sync", "--json"),
            *("--out", f"{{work}}/real_hfconv_seed{seed}"),
        ]
        for seed in range(5)
    },
    # workflow.stream_step at staleness 0: async's rollout and trainer processes, every sample on-policy
    # (sync runs without it, its whole batch in one rollout call: bench/peer.py)
    **{
        name: [
            *_REAL_PEER,
            *_STREAMED,
            *(("--set", f"seed={seed}", "--set", f"rollout.engine.seed={seed}") if seed else ()),
            "--json",
            "--out",
            "{work}/" + name,
        ]
        for name, seed in (("real_stream", 0), ("real_stream_seed1", 1), ("real_stream_seed2", 2))
    },
    # a step of the real model, role by role (docs/performance.md, with real_rollout's profile and real_train)
    "real_breakdown": [
        *(PY, "-m", "asyncflow.cli.main", "bench", "e2e", "--config", "examples/smollm2.toml", "--steps", "6"),
        *(
            "--set",
            "eval.every_steps=0",
            "--set",
            "eval.at_start=false",
            "--breakdown",
            "--json",
            "--out",
            "{work}/real_breakdown",
        ),
    ],
    # the example as shipped on the CPU this runs on, against TRL on both cores (the fair comparison of speed:
    # asyncflow's processes use both cores too)
    "real_peer_here": [*_REAL_PEER, "--trl-threads", "2", "--json", "--out", "{work}/real_peer_here"],
    "real_peer_trl2": [  # TRL alone with two torch threads: the same work on both cores, beside real_peer's
        *_REAL_PEER,
        "--trl-threads",
        "2",
        "--only-trl",
        "--json",
        "--out",
        "{work}/real_peer_trl2",
    ],
    # docs/performance.md
    "breakdown": [
        PY,
        "-m",
        "asyncflow.cli.main",
        "bench",
        "e2e",
        "--config",
        "examples/local.toml",
        "--steps",
        "100",
        "--breakdown",
        "--json",
        "--out",
        "{work}/breakdown",
    ],
    "peer": [
        PY,
        "-m",
        "asyncflow.cli.main",
        "bench",
        "peer",
        "--steps",
        "300",
        "--rounds",
        "3",
        "--json",
        "--out",
        "{work}/peer",
    ],
    "ab": [PY, "scripts/ab_e2e.py", "--before-rev", BASE_REV, "--rounds", "2", "--steps", "100", "--out", "{work}/ab"],
    "ab_pin": [
        PY,
        "scripts/ab_e2e.py",
        "--before",
        ".",
        "--before-set",
        "cluster.pin_trainer_cores=0",
        "--after-set",
        "cluster.pin_trainer_cores=1",
        "--rounds",
        "2",
        "--steps",
        "100",
        "--out",
        "{work}/ab_pin",
    ],
    "ab_call": [
        PY,
        "scripts/ab_e2e.py",
        "--before",
        ".",
        "--before-set",
        "rollout.prompts_per_call=8",
        "--before-set",
        "rollout.engine.max_batch_size=64",
        "--rounds",
        "1",
        "--steps",
        "100",
        "--out",
        "{work}/ab_call",
    ],
    "micro": [PY, "scripts/perf_micro.py", "--before-rev", BASE_REV, "--json"],
    "ab_round2": [
        PY,
        "scripts/ab_e2e.py",
        "--before-rev",
        ROUND2_REV,
        "--rounds",
        "2",
        "--steps",
        "100",
        "--out",
        "{work}/ab_round2",
    ],
    "ab_round3": [
        PY,
        "scripts/ab_e2e.py",
        "--before-rev",
        ROUND3_REV,
        "--rounds",
        "2",
        "--steps",
        "100",
        "--out",
        "{work}/ab_round3",
    ],
    # issue 31, item 2: the queue host's CPU per row and rollout GetBatch calls per step, the queue before the
    # flat selection and server-side waits (QUEUE_REV) against this tree, case by case, at the sizes (4k to
    # 64k rows per step, 8 to 512 replicas)
    "queue_scale": [
        *(PY, "scripts/queue_scale_ab.py", "--before-rev", QUEUE_REV, "--rows", "4096,16384,65536"),
        *("--replicas", "8,64,256,512", "--out", "{work}/queue_scale"),
    ],
    # issue 31, item 3: the collector's trace cost per million events, the unbounded trace (QUEUE_REV) against this
    # tree's, at two run lengths (about 2 minutes)
    "trace_cost": [
        PY,
        "scripts/trace_cost_ab.py",
        "--before-rev",
        QUEUE_REV,
        "--events",
        "100000,400000",
        "--out",
        "{work}/trace_cost",
    ],
    # issue 31, item 1: weight fan-out, direct against the relay tree, at 2 to 128 replicas (about 5 minutes)
    "fanout": [
        *(PY, "-m", "asyncflow.cli.main", "bench", "fanout", "--replicas", "2,8,32,128"),
        *("--mb", "16", "--versions", "3", "--json"),
    ],
    # the same with every sender's uplink emulated (25 MB/s), as when each replica has a host of its own: the time to
    # the last replica that the shared cores hide above (about 6 minutes)
    "fanout_link": [
        *(PY, "-m", "asyncflow.cli.main", "bench", "fanout", "--replicas", "2,8,32,128", "--mb", "4"),
        *("--link-mb-s", "25", "--versions", "3", "--json"),
    ],
    # issue 31, item 5: the paper's table on the digital twin (afctl twin: 7B and 32B, 32 to 1,024 emulated NPUs,
    # sync, async and colocated each): about 15 minutes on 2 cores
    # issue 31 item 6: the online planner against none, whole runs, 6 rounds alternating which goes first (~25 min)
    "planner_rounds": [
        *(PY, "-m", "asyncflow.cli.main", "bench", "planner", "--rounds", "6"),
        *("--json", "--out", "{work}/planner_rounds"),
    ],
    "twin": [
        *(PY, "scripts/twin_table.py", "--cases", "7b:32,64,256,1024", "32b:32,64,256,1024"),
        *("--steps", "5", "--out", "{work}/twin"),
    ],
    "ab_seams": [
        PY,
        "scripts/ab_e2e.py",
        "--before-rev",
        SEAMS_REV,
        "--rounds",
        "3",
        "--steps",
        "100",
        "--queue-rounds",
        "1000",
        "--out",
        "{work}/ab_seams",
    ],
    "ab_prefetch": [
        PY,
        "scripts/ab_e2e.py",
        "--before",
        ".",
        "--before-set",
        "workflow.prefetch_batch=false",
        "--rounds",
        "2",
        "--steps",
        "100",
        "--out",
        "{work}/ab_prefetch",
    ],
    "ab_placement": [
        PY,
        "scripts/ab_e2e.py",
        "--before",
        ".",
        "--before-set",
        "reward.placement=role",
        "--rounds",
        "2",
        "--steps",
        "100",
        "--out",
        "{work}/ab_placement",
    ],
}
PERFORMANCE = (
    "breakdown",
    "peer",
    "ab",
    "ab_round2",
    "ab_round3",
    "ab_prefetch",
    "ab_placement",
    "ab_pin",
    "ab_call",
    "ab_seams",
    "micro",
)
"""The sections of docs/performance.md; the others are docs/results.md's."""
REAL_PERFORMANCE = ("real_breakdown", "real_rollout", "real_train")
"""Real-model sections docs/performance.md also reads (real_breakdown is its own; the other two are docs/real-model.md's too)."""


def _cpu() -> str:
    """What the figures ran on (the preflight's reading of /proc/cpuinfo): a CPU with
    bfloat16 instructions runs the real-model sections' mixed precision several times
    faster than one without (engines/precision.py)."""
    from asyncflow.planner.io import local_cpu_peak

    peak = local_cpu_peak()
    return peak.describe.removeprefix("this CPU: ") if peak is not None else "unknown"


def measure(name: str, work: Path) -> dict:
    cmd = [part.format(work=work) for part in SECTIONS[name]]
    print(f"== {name}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    started = time.time()
    done = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stdout[-3000:]}")
    last = [line for line in done.stdout.splitlines() if line.startswith("{")][-1]
    record = {
        "command": shlex.join(["python" if c == PY else c for c in cmd]),
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "seconds": round(time.time() - started),
        "load_avg_1m": round(os.getloadavg()[0], 1),
        "cpu": _cpu(),
        "result": json.loads(last),
    }
    (work / f"{name}.json").write_text(json.dumps(record, indent=1))
    (ROOT / DATA_DIR).mkdir(parents=True, exist_ok=True)  # the pages' source, kept in the repository
    (ROOT / DATA_DIR / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _parity_stream(r: dict) -> list[str]:
    """The parity runs with async streamed on-policy (``workflow.stream_step``, k = 0), beside
    the parity section's sync and async means (its JSON in docs/data, when there)."""
    kept = ROOT / DATA_DIR / "parity.json"
    parity = json.loads(kept.read_text()) if kept.exists() else None
    p = r["result"]["parity"]
    a = p["async"]
    out = [
        "## Learning: async streamed on-policy (k = 0, `workflow.stream_step`)",
        "",
        f"`{r['command']}` ({r['when']}, load {r['load_avg_1m']}): the same runs with the trainer taking each step's "
        "prompt groups in parts as the rollout puts them (4 prompts a call, micro-batches of 32 rows), one optimizer step "
        "per step, every sample trained by the version that generated it (docs/algorithms.md, 'Streamed steps').",
        "",
        "| seed | reward, first 10% of steps | reward, last 10% | samples/s | held-out greedy accuracy, final / best |",
        "|---|---|---|---|---|",
    ]
    for i, seed in enumerate(p["seeds"]):
        out.append(
            f"| {seed} | {a['reward_first_10pct'][i]:.3f} | {a['reward_last_10pct'][i]:.3f} | "
            f"{a['samples_per_s'][i]:.0f} | {a['val_final_accuracy'][i]} / {a['val_best_accuracy'][i]} |"
        )
    line = f"Last-10% reward over the seeds: **{a['reward_last_10pct_mean']:.3f}**"
    if parity is not None:
        base = parity["result"]["parity"]
        line += (
            f", against sync {base['sync']['reward_last_10pct_mean']:.3f} and async k = 1 "
            f"{base['async']['reward_last_10pct_mean']:.3f} above; samples/s {_mean(a['samples_per_s']):.0f} against "
            f"{_mean(base['sync']['samples_per_s']):.0f} and {_mean(base['async']['samples_per_s']):.0f} (separate runs)"
        )
    return out + ["", line + ".", ""]


def _render_parity(r: dict) -> list[str]:
    p = r["result"]["parity"]
    s, a = p["sync"], p["async"]
    out = [
        "## Learning: async (k = 1) against sync, seed by seed",
        "",
        f"`{r['command']}` ({r['when']}, load {r['load_avg_1m']}): `examples/local.toml` as shipped, 300 steps"
        " x 128 samples per run, each run a fresh `afctl up`.",
        "",
        "| mode | seed | reward, first 10% of steps | reward, last 10% | samples/s | held-out greedy accuracy, final / best |",
        "|---|---|---|---|---|---|",
    ]
    for mode, m in (("sync", s), ("async", a)):
        for i, seed in enumerate(p["seeds"]):
            out.append(
                f"| {mode} | {seed} | {m['reward_first_10pct'][i]:.3f} | {m['reward_last_10pct'][i]:.3f} | "
                f"{m['samples_per_s'][i]:.0f} | {m['val_final_accuracy'][i]} / {m['val_best_accuracy'][i]} |"
            )
    out += [
        "",
        f"Last-10% reward over the seeds: **sync {s['reward_last_10pct_mean']:.3f}, async "
        f"{a['reward_last_10pct_mean']:.3f}** (async - sync = {p['async_minus_sync']:+.3f}); async samples/s "
        f"{_mean(a['samples_per_s']):.0f} against sync {_mean(s['samples_per_s']):.0f} "
        f"({_mean(a['samples_per_s']) / _mean(s['samples_per_s']):.2f}x, separate runs).",
        "",
    ]
    return out


def render(records: dict[str, dict]) -> str:
    out = [
        "# Measured results (this 2-core CPU machine)",
        "",
        "Written by `python scripts/results.py` from the JSON line of each command below; do not edit by hand.",
        "The machine: 2 cores, 24 GiB, no accelerator, sometimes shared with other jobs (the load average at the",
        "end of each command is given), so absolute figures move by 10-30% between runs; ratios measured side by",
        "side in one invocation are more trustworthy.",
        "",
        "The figures below are of the tiny model the project builds itself; a real pretrained model (SmolLM2-135M) has a",
        "page of its own: [real-model.md](real-model.md), which opens with its targets and where each stands.",
        "",
    ]
    if "parity" in records:  # a block: measured alone (--only parity), it is spliced into the page as it stands
        out += block_lines("parity", _render_parity(records["parity"]))
    if "objective" in records:
        r = records["objective"]
        o = r["result"]["parity"]["async"]
        line = [
            "## Why async needs the behaviour clip",
            "",
            f"`{r['command']}` ({r['when']}, load {r['load_avg_1m']}): the same async runs with the ratio clipped "
            "against the proximal policy (the trainer's weights before the step), the default until this page's "
            "previous version.",
            "",
            "| seed | reward, last 10% |",
            "|---|---|",
        ]
        line += [f"| {seed} | {x:.3f} |" for seed, x in zip(r["result"]["parity"]["seeds"], o["reward_last_10pct"])]
        line += [
            "",
            f"Mean **{o['reward_last_10pct_mean']:.3f}**. With one optimizer step per batch the proximal "
            "ratio is identically 1, so nothing bounds how far a step moves the policy from the one that "
            "generated its (one version old) samples; see docs/algorithms.md.",
            "",
        ]
        if "parity" in records:
            a = records["parity"]["result"]["parity"]["async"]["reward_last_10pct_mean"]
            line[-2] += f" Clipped against the behaviour policy (shipped): {a:.3f}."
        out += line
    for name, k in (("e2e", 1), ("e2e_k2", 2)):
        if name not in records:
            continue
        r = records[name]
        e = r["result"]
        if name == "e2e":
            out += [
                "## Throughput: sync vs async side by side",
                "",
                "| command | k | sync samples/s | async samples/s | ratio | async pipeline efficiency | async busy fractions |",
                "|---|---|---|---|---|---|---|",
            ]
        busy = ", ".join(f"{role} {v:.2f}" for role, v in sorted(e["async_busy_fraction"].items()))
        out.append(
            f"| `{r['command']}` (load {r['load_avg_1m']}) | {k} | {e['sync_samples_per_s']:.0f} | "
            f"{e['async_samples_per_s']:.0f} | {e['ratio']:.2f} | {e['async_pipeline_efficiency']:.2f} | {busy} |"
        )
        if name == "e2e_k2" or "e2e_k2" not in records:
            out += [
                "",
                "On these 2 cores async is CPU-bound: the busy fractions of all roles add up to more than one "
                "core, so each process runs slower while the others share its cores. Where rollout and training "
                "have their own devices the async bound is max(train, rollout), not their sum.",
                "",
            ]
    if "queue" in records:
        r = records["queue"]
        q = r["result"]
        out += [
            "## TransferQueue: small rows in the controller's reply",
            "",
            f"`{r['command']}` (load {r['load_avg_1m']}), both in one invocation:",
            "",
            "| | round trip (put -> consumer holds the rows) | samples/s |",
            "|---|---|---|",
            f"| read from the shard | {q['round_trip_ms_read']:.3f} ms | {q['samples_per_s_read']:.0f} |",
            f"| inline in the GetBatch reply | {q['round_trip_ms_inline']:.3f} ms | {q['samples_per_s_inline']:.0f} |",
            "",
            f"Ratio {q['round_trip_ratio']:.2f}.",
            "",
        ]
    if "train" in records:
        r = records["train"]
        t = r["result"]
        out += [
            "## Data-parallel trainer (FSDP2 over gloo)",
            "",
            f"`{r['command']}` (load {r['load_avg_1m']}): one process {t['tokens_per_s']:.0f} tokens/s, "
            f"{t['fsdp2_processes']} FSDP2 processes {t['fsdp2_tokens_per_s']:.0f} tokens/s (ratio "
            f"{t['ratio_fsdp2_to_one_process']:.2f}). A model this small has nothing to gain from sharding; "
            "data parallelism is there for models that do not fit one device.",
            "",
        ]
    if "packing" in records:
        r = records["packing"]
        t = r["result"]
        out += [
            "## Sequence packing in the trainer",
            "",
            f"`{r['command']}` (load {r['load_avg_1m']}): a long-tailed batch (32 rows, every 8th response long), "
            f"padded and packed steps alternating: padded {t['padded_tokens_per_s']:.0f} tokens/s, packed "
            f"{t['packed_tokens_per_s']:.0f} tokens/s (ratio {t['ratio_packed_to_padded']:.2f}). Tokens through the "
            f"model per step: {t['padded_fed_tokens_per_step']} padded, {t['packed_fed_tokens_per_step']} packed, "
            f"{t['real_tokens_per_step']} real. Attention kept within sequences by {t['pack_attention']}; largest "
            f"step-loss difference {t['max_loss_diff']:.1e} (docs/algorithms.md, Sequence packing).",
            "",
        ]
    for name in ("dynamic_sampling", "dynamic_sampling_sync"):
        if name in records:
            out += _render_dynamic_sampling(records[name])
    for name, render_block in BLOCKS.items():
        if name in records and name not in INLINE_BLOCKS:
            out += block_lines(name, render_block(records[name]))
    return "\n".join(out)


def block_lines(name: str, lines: list[str]) -> list[str]:
    """A section's lines between the markers ``splice_block`` finds again."""
    return [f"<!-- results:{name} -->", *lines, f"<!-- /results:{name} -->", ""]


def splice_block(page: str, name: str, lines: list[str]) -> str:
    """``page`` with the block of section ``name`` replaced (appended when it has none)."""
    begin, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
    block = "\n".join(block_lines(name, lines)).rstrip() + "\n"
    if begin in page and end in page:
        head, rest = page.split(begin, 1)
        return head + block.rstrip("\n") + rest.split(end, 1)[1]
    return page.rstrip("\n") + "\n\n" + block


def _render_algorithms(r: dict) -> list[str]:
    from algorithms_check import table_lines

    a = r["result"]["algorithms"]
    steps = f"{a['steps']} steps (shortened)" if a.get("steps") else "300 steps as shipped"
    algs = a["algorithms"]
    ranked = sorted(algs, key=lambda n: -algs[n]["reward_last_10pct_mean"])
    spread = max(max(x["reward_last_10pct"]) - min(x["reward_last_10pct"]) for x in algs.values())
    fastest = max(algs, key=lambda n: algs[n]["samples_per_s_mean"])
    order = ", ".join(f"{n} {algs[n]['reward_last_10pct_mean']:.3f}" for n in ranked)
    return [
        "## Policy losses and advantage estimators side by side",
        "",
        f"`{r['command']}` ({r['when']}, load {r['load_avg_1m']}): `{a['config']}`, async (k = 1), {steps}, "
        f"seeds {', '.join(str(s) for s in a['seeds'])}; each algorithm with the keys shown over the example "
        "(each loss at its paper's clip range; docs/algorithms.md). The same on SmolLM2-135M: "
        "[real-model.md, 'The algorithms on the real model'](real-model.md#the-algorithms-on-the-real-model).",
        "",
        *table_lines(a),
        "",
        f"On this task, by mean last-10% reward: {order}. The seeds of one algorithm spread by up to {spread:.2f}, "
        "so only gaps larger than that say more than the seeds do. Every loss and estimator costs the same forward "
        "and backward, so samples/s (highest here: "
        f"{fastest}) follow the machine's load, shared with other jobs during the runs, and how long each run's "
        "responses were, more than the algorithm.",
        "",
        "Which to pick when: GRPO, or Dr. GRPO (no std division, no per-response length normalisation: no bias "
        "towards short wrong answers or towards easy and hard prompts), for verifiable rewards and groups of "
        "responses per prompt; RLOO with small groups (its baseline leaves the response itself out, so it stays "
        "unbiased at 2 to 4 responses); REINFORCE++ when each prompt is sampled once (no groups: the batch's "
        "whitening is the baseline), its baseline variant when there are groups; GSPO for long responses and "
        "mixture-of-experts models, where per-token ratios are noisy and a whole response should be kept or "
        "clipped; CISPO when rare tokens whose ratio has moved far must keep their gradient (long reasoning). "
        "On a six-token addition task with a 0.1M-parameter model neither of the last two has the problem it solves.",
        "",
    ]


def _render_queue_scale(r: dict) -> list[str]:
    q = r["result"]
    out = [
        "## The queue host as replicas and rows per step grow (issue 31)",
        "",
        f"`{r['command']}` ({r['when']}, load {r['load_avg_1m']}): `asyncflow/bench/queue_scale.py` (the queue as "
        f"deployed, replicas and trainer emulated on threads with real nng sockets, {q['train_ms']:g} ms of emulated "
        f"training per step, {q['steps'] - 1} measured steps), the queue of {q['before_rev']} (replicas poll) against "
        "this tree's (docs/scale.md), case by case. Control = the manager and the controllers' process.",
        "",
        "| rows per step | replicas | control CPU, us per row: before | after | GetBatch calls per step: before | after |",
        "|---|---|---|---|---|---|",
    ]
    for c in q["cases"]:
        b, a = c["before"], c["after"]
        out.append(
            f"| {c['rows']} | {c['replicas']} | {b['control_cpu_us_per_row']:g} | **{a['control_cpu_us_per_row']:g}** "
            f"| {b['rollout_gets_per_step']:g} | **{a['rollout_gets_per_step']:g}** |"
        )
    out += ["", *_queue_scale_targets(q["cases"]), ""]
    return out


def _queue_scale_targets(cases: list[dict]) -> list[str]:
    """Issue 31 item 2's two targets, read off the cases: the control CPU per row within 2x over the replica counts
    (at each rows per step), and no quadratic term in rows per step (the CPU per row does not grow with the rows)."""
    lines = []
    for key in ("before", "after"):
        per_row = {(c["rows"], c["replicas"]): c[key]["control_cpu_us_per_row"] for c in cases}
        rows = sorted({r for r, _ in per_row})
        replicas = sorted({n for _, n in per_row})
        spread = [max(per_row[r, n] for n in replicas) / min(per_row[r, n] for n in replicas) for r in rows]
        growth = [per_row[rows[-1], n] / per_row[rows[0], n] for n in replicas]
        lines.append(
            f"- **{key.capitalize()}:** over {replicas[0]} to {replicas[-1]} replicas the control CPU per row varies by "
            f"{min(spread):.2f}x to {max(spread):.2f}x (the largest over the smallest, at each rows per step; target "
            f"within 2x); from {rows[0]} to {rows[-1]} rows per step ({rows[-1] // rows[0]}x) it changes by "
            f"{min(growth):.2f}x to {max(growth):.2f}x per row, at each replica count (a quadratic term would grow it "
            f"about {rows[-1] // rows[0]}x)."
        )
    return lines


def _render_trace_cost(r: dict) -> list[str]:
    t = r["result"]
    out = [
        "## The collector's trace over a long run (issue 31 item 3)",
        "",
        f"`{r['command']}` ({r['when']}, load {r['load_avg_1m']}): `scripts/trace_cost.py` (the collector actor fed span "
        f"events 500 to a message, as a busy role sends them, with a live write of trace.json every {t['every']} events, "
        f"one process per measurement), the collector of {t['before_rev']} (every event kept, the whole file rewritten "
        "at each write) against this tree's (chunks appended; docs/scale.md), at two run lengths.",
        "",
        "| events in the run | collector CPU, s per million events: before | after | its longest call, s: before | after "
        "| peak memory growth, MB: before | after |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in t["cases"]:
        b, a = c["before"], c["after"]
        out.append(
            f"| {c['events']} | {b['cpu_s_per_million']:g} | **{a['cpu_s_per_million']:g}** | {b['longest_call_s']:g} "
            f"| **{a['longest_call_s']:g}** | {b['peak_rss_growth_mb']:g} | **{a['peak_rss_growth_mb']:g}** |"
        )
    first, last = t["cases"][0], t["cases"][-1]
    x = last["events"] / first["events"]

    def grew(key: str, field: str) -> str:
        return f"{last[key][field] / first[key][field]:.2f}x" if first[key][field] > 0 else "from 0"

    out += [
        "",
        f"From {first['events']} to {last['events']} events ({x:g}x the run): the CPU per million events grew "
        f"{grew('before', 'cpu_s_per_million')} before and {grew('after', 'cpu_s_per_million')} after; the collector's "
        f"longest call (a Spans message or a live write: the longest it answers nothing else) "
        f"{grew('before', 'longest_call_s')} before and {grew('after', 'longest_call_s')} after; the memory "
        f"{grew('before', 'peak_rss_growth_mb')} before and {grew('after', 'peak_rss_growth_mb')} after.",
        "",
    ]
    return out


def _fanout_head(r: dict, title: str) -> tuple[list[str], dict, list[int]]:
    """The heading, the command and the table of a ``bench fanout`` section; its rows by (replicas, mode)."""
    rows = r["result"]["rows"]
    by = {(x["replicas"], x["fanout"]): x for x in rows}
    counts = sorted({x["replicas"] for x in rows})
    size = rows[0]["version_bytes"] / 1e6
    degree = next((x["degree"] for x in rows if x["fanout"] == "tree"), 2)
    out = [
        f"## {title}",
        "",
        f"`{r['command']}` ({r['when']}, load {r['load_avg_1m']}): the real `weights` actor, roster, announcements, "
        "inbox, receivers and relays over ipc nng, with light replicas whose engine only keeps the tensors (64 per "
        f"process); {size:.1f} MB per version in 1 MiB chunks, the median of 3 versions after a warm-up. `direct`: "
        f"every replica pulls from the trainer; `tree`: replicas relay to each other, {degree} children a node "
        "(docs/scale.md, 'Weight fan-out').",
        "",
        "| replicas | trainer MB per version: direct | tree | trainer-process CPU-s per version: direct | tree "
        "| last replica, s: direct | tree |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in counts:
        d, t = by[n, "direct"], by[n, "tree"]
        out.append(
            f"| {n} | {d['trainer_bytes_per_version'] / 1e6:.1f} ({d['trainer_copies_per_version']:g} copies) "
            f"| **{t['trainer_bytes_per_version'] / 1e6:.1f} ({t['trainer_copies_per_version']:g})** "
            f"| {d['trainer_cpu_s']:.2f} | **{t['trainer_cpu_s']:.2f}** | {d['last_replica_s']:.2f} | **{t['last_replica_s']:.2f}** |"
        )
    return out, by, counts


def _render_fanout_link(r: dict) -> list[str]:
    rows = r["result"]["rows"]
    out, by, counts = _fanout_head(r, "Weight fan-out over an emulated link (issue 31 item 1)")
    lo, hi = counts[0], counts[-1]
    d_growth = by[hi, "direct"]["last_replica_s"] / by[lo, "direct"]["last_replica_s"]
    t_growth = by[hi, "tree"]["last_replica_s"] / by[lo, "tree"]["last_replica_s"]
    errors = [e for x in rows for e in x["errors"]]
    out += [
        "",
        f"Every sender (the trainer's `weights` actor and each replica's relay) sends at most {rows[0]['link_mb_s']:g} "
        "MB/s, its chunks one after another (`--link-mb-s`, `actors/weights/_link.py`), as when each replica has a "
        "host and link of its own; the versions are small, so that this box's memory copies weigh less than the links. "
        f"From {lo} to {hi} replicas ({hi // lo}x) the time to the last replica grew {d_growth:.1f}x direct (the "
        f"trainer's link carries a copy per replica) and {t_growth:.1f}x with the tree (the trainer's link carries "
        f"{by[hi, 'tree']['trainer_copies_per_version']:g} copies; each level adds one chunk's hop, the chunks "
        f"pipelined: {hi.bit_length() - 1} levels at {hi} replicas). Fallbacks to a source higher in the tree: "
        f"{sum(x['fallbacks'] for x in rows)}; errors: {len(errors)}.",
        "",
    ]
    return out


def _render_fanout(r: dict) -> list[str]:
    rows = r["result"]["rows"]
    out, by, counts = _fanout_head(r, "Weight fan-out as replicas grow (issue 31 item 1)")
    lo, hi = by[counts[0], "tree"], by[counts[-1], "tree"]
    dlo, dhi = by[counts[0], "direct"], by[counts[-1], "direct"]
    errors = [e for x in rows for e in x["errors"]]
    out += [
        "",
        f"- From {counts[0]} to {counts[-1]} replicas the trainer serves {lo['trainer_copies_per_version']:g} to "
        f"{hi['trainer_copies_per_version']:g} copies a version with the tree, {dlo['trainer_copies_per_version']:g} to "
        f"{dhi['trainer_copies_per_version']:g} direct; its process's CPU per version is "
        f"{dhi['trainer_cpu_s'] / hi['trainer_cpu_s']:.1f}x lower with the tree at {counts[-1]}.",
        f"- Time to the last replica grows with n in both modes here ({dlo['last_replica_s']:.2f} to "
        f"{dhi['last_replica_s']:.2f} s direct, {lo['last_replica_s']:.2f} to {hi['last_replica_s']:.2f} s tree): every "
        "replica of this one box still receives, copies and digests the whole version on the same 2 cores, so the "
        "box's memory copies, not a link, set the time. Where each replica has a host and link of its own, direct is "
        "n copies over the trainer's one link and the tree the degree's copies plus one chunk hop a level, which is "
        "what the planner charges (`planner/cost.py` `fanout_s`); the next section emulates such links.",
        f"- Fallbacks to a source higher in the tree: {sum(x['fallbacks'] for x in rows)}; errors: "
        f"{len(errors)}{' (' + '; '.join(errors[:2]) + ')' if errors else ''}.",
        "",
    ]
    return out


PAPER = {"mean": 1.59, "peak": 2.03, "peak_at": "7B, 256 NPUs", "ablation": (1.00, 2.01, 2.74), "linearity": (0.65, 0.88)}
"""AsyncFlow's (arXiv 2507.01663) figures as issue 31 quotes them: speedup over verl on 32 to 1,024 Ascend NPUs, its
ablation, and its scaling linearity when the cluster grows 16x."""


def _linearity(cases: list[dict], model: str, key: str) -> tuple[float, int, int]:
    """(throughput growth over device growth, smallest N, largest N) of ``model``'s async runs."""
    rows = sorted((c for c in cases if c["model"] == model), key=lambda c: c["npus"])
    lo, hi = rows[0], rows[-1]
    growth = hi["modes"]["async"][key] / lo["modes"]["async"][key]
    return growth / (hi["npus"] / lo["npus"]), lo["npus"], hi["npus"]


def _render_twin(r: dict) -> list[str]:
    t = r["result"]
    failed = [c for c in t["cases"] if "failed" in c]
    cases = [c for c in t["cases"] if "failed" not in c]
    wl = cases[0]["workload"]
    out = [
        "## The paper's table on the digital twin (issue 31)",
        "",
        f"`{r['command']}` ({r['when']}, load {r['load_avg_1m']}, {t['wall_s']} s): `afctl twin` for each model and NPU "
        f"count (docs/scale.md, 'The digital twin'): the planner's split of the devices becomes emulated engines (rollout "
        "replicas packed up to a quarter of them per process) and the real control plane runs it in sync, async (staleness "
        f"1) and colocated mode, {t['steps']} steps each, the first 2 left out. Workload: {wl['prompts_per_step']} prompts x "
        f"{wl['group']} samples per step, prompts of {wl['prompt_tokens']} tokens, responses of {wl['response_tokens_mean']} "
        f"on average (log-normal, sigma 1) capped at {wl['response_tokens_max']}, no reference, GRPO; Ascend "
        f"{t['hardware'].upper()}. Samples/s are modelled (the twin's samples/s x its time_scale, which makes the "
        "predicted async step about 2 s here).",
        "",
        "| model | NPUs | async split: replicas x tp / train | samples/s predicted: colocated / sync / async | measured "
        "| error (async) | async / colocated: planner / twin | async / sync: planner / twin | planner at the paper's "
        "workload | overhead per async step: queue / weights / directory / driver, ms (% of the step) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        m = c["modes"]
        a = m["async"]
        pct = " / ".join(
            f"{a['overhead_ms'][k]:.1f} ({100 * a['overhead_frac'][k]:.1f}%)" for k in ("queue", "weights", "directory", "driver")
        )
        pred = " / ".join(f"{m[k]['predicted_samples_per_s']:.2f}" for k in ("colocated", "sync", "async"))
        meas = " / ".join(f"{m[k]['measured_samples_per_s']:.2f}" for k in ("colocated", "sync", "async"))
        out.append(
            f"| {c['model']} | {c['npus']} | {a['replicas']} x {a['rollout_tp']} / {a['train_devices']} | {pred} | {meas} | "
            f"{100 * a['error']:+.0f}% | {c['predicted_speedup_async_over_colocated']:.2f} / "
            f"**{c['speedup_async_over_colocated']:.2f}** | {c['predicted_speedup_async_over_sync']:.2f} / "
            f"{c['speedup_async_over_sync']:.2f} | {c['planner_paper_workload_speedup']:.2f} | {pct} |"
        )
    out += [f"| {c['model']} | {c['npus']} | failed: {c['failed']} | | | | | | | |" for c in failed]
    twin_sp = [c["speedup_async_over_colocated"] for c in cases]
    plan_sp = [c["predicted_speedup_async_over_colocated"] for c in cases]
    paper_wl = [c["planner_paper_workload_speedup"] for c in cases]
    peak = max(cases, key=lambda c: c["speedup_async_over_colocated"])
    sync_ab = [c["modes"]["sync"]["measured_samples_per_s"] / c["modes"]["colocated"]["measured_samples_per_s"] for c in cases]
    errors = [abs(c["modes"][k]["error"]) for c in cases for k in ("sync", "async", "colocated")]
    frac = [sum(c["modes"]["async"]["overhead_frac"].values()) for c in cases]
    worst, worst_mode = max(
        ((c, k) for c in cases for k in ("sync", "async", "colocated")), key=lambda ck: abs(ck[0]["modes"][ck[1]]["error"])
    )
    worst_share = sum(worst["modes"][worst_mode]["overhead_frac"][k] for k in ("queue", "driver"))
    failed_names = ", ".join(f"{c['model'].upper()} x {c['npus']}" for c in failed)
    out += [
        "",
        "| figure | paper | planner, this workload | twin (measured) |",
        "|---|---|---|---|",
        f"| mean speedup over the colocated baseline | {PAPER['mean']:.2f}x | {_mean(plan_sp):.2f}x | **{_mean(twin_sp):.2f}x** |",
        f"| mean speedup, the planner at the paper-like workload (a reference, prompts of 1,024) | {PAPER['mean']:.2f}x | "
        f"{_mean(paper_wl):.2f}x | - |",
        f"| peak speedup | {PAPER['peak']:.2f}x ({PAPER['peak_at']}) | {max(plan_sp):.2f}x | "
        f"**{peak['speedup_async_over_colocated']:.2f}x** "
        f"({peak['model'].upper()}, {peak['npus']} NPUs) |",
        f"| ablation: colocated / task-separated sync / async, mean | {' / '.join(f'{x:.2f}' for x in PAPER['ablation'])} | "
        f"1.00 / {_mean([c['predicted_speedup_async_over_colocated'] / c['predicted_speedup_async_over_sync'] for c in cases]):.2f} / "
        f"{_mean(plan_sp):.2f} | **1.00 / {_mean(sync_ab):.2f} / {_mean(twin_sp):.2f}** |",
    ]
    for model in sorted({c["model"] for c in cases}):
        lin_m, lo, hi = _linearity(cases, model, "measured_samples_per_s")
        lin_p, _, _ = _linearity(cases, model, "predicted_samples_per_s")
        out.append(
            f"| linearity, {model.upper()} async, {lo} -> {hi} NPUs ({hi // lo}x) | {PAPER['linearity'][0]:.2f} and "
            f"{PAPER['linearity'][1]:.2f} (over 16x) | {lin_p:.2f} | **{lin_m:.2f}** |"
        )
    largest = max(c["npus"] for c in cases)
    walls = [c["wall_s"] for c in cases if c["npus"] == largest]
    out += [
        "",
        f"- **Time on this box.** A case (its {len(cases[0]['modes'])} modes, each a whole run with its start and "
        f"stop) took {min(c['wall_s'] for c in cases):.0f} to {max(c['wall_s'] for c in cases):.0f} s; those of "
        f"{largest} logical devices {min(walls):.0f} to {max(walls):.0f} s (issue 31's target: under 10 minutes).",
        f"- **The twin against its planner.** Measured throughput is within {100 * max(errors):.0f}% of the prediction in "
        f"every mode and case (mean |error| {100 * _mean(errors):.0f}%); the largest is {worst_mode} at "
        f"{worst['model'].upper()} x {worst['npus']} ({worst['modes'][worst_mode]['replicas']} replicas), where the queue "
        f"and the driver took {100 * worst_share:.0f}% of the emulated step's time in CPU on these 2 cores. The "
        "framework's overhead per async step (queue, "
        f"weights, directory, driver together) is {100 * min(frac):.1f}% to {100 * max(frac):.1f}% of the emulated step "
        "here. These are this box's processes at this time_scale: where an overhead does not grow with the modelled "
        "step, its share at full scale is time_scale times smaller (a 2 s step here stands for 25 to 700 s).",
        f"- **The twin's speedups against the planner's** (mean {_mean(twin_sp):.2f}x measured, {_mean(plan_sp):.2f}x "
        "predicted). The planner's async rollout streams (continuous batching hides each call's long tail behind the "
        "next); the emulated replica serves one generate call at a time and pays each call's tail, so async gets less "
        "than the planner credits it, while sync and colocated pay the tail either way. The weights take the real "
        "model's transfer time: the emulated version (256 bytes) goes to each replica over an emulated link "
        "(`workflow.weight_link_mb_s`) whose rate makes the copies take the planner's transfer for the split, times "
        "time_scale; colocated's offload of the training state is not slept. Every gap here is also the 2 shared "
        "cores: 2,048 rows per step of tokenizing, scoring and queue traffic cost real CPU beside the emulated sleep.",
        f"- **Against the paper (mean {PAPER['mean']}x, peak {PAPER['peak']}x).** The paper's baseline is verl as "
        "measured; ours is the planner's clean colocated model of it (no log-prob recomputation, no engine "
        "start/stop, a local reshard; docs/planner.md, 'The paper's settings'), which favours the baseline. The paper's "
        "lengths and batch are not published: this workload (no reference model, prompts of 768 tokens) is ours, and the "
        "speedup is as large as the assumed tail. The column 'planner at the paper's workload' is the planner with a "
        "reference and 1,024-token prompts (scripts/paper_table.py): the twin's workload drops the reference, which "
        "the emulated run has no role for.",
        f"- **Ablation.** The paper's three steps are its own components switched on one by one; ours are the three "
        f"modes, colocated (1.00), task-separated sync through the queue, async. Task-separated sync is "
        f"{'slower' if _mean(sync_ab) < 1 else 'faster'} than colocated here (mean {_mean(sync_ab):.2f}): with part of "
        "the devices each, a phase waits for the other, which pays only once the two overlap (async).",
        *(
            [
                f"- **Failed:** {failed_names} (the error its run gave is in the table, the run's twin.log has the "
                "rest); the figures above leave them out."
            ]
            if failed
            else []
        ),
        "- **Linearity** at a fixed batch (256 x 8) is low for the planner and the twin alike: past a few hundred NPUs "
        "a step is bound by the dependency loop and the longest response, which more devices do not shorten. The "
        "paper's 0.65 and 0.88 need a batch that grows with the cluster (the planner gives 0.74 and 0.92 with "
        "1,024 x 16; issue 31).",
        "",
    ]
    return out


def _render_dynamic_sampling(r: dict) -> list[str]:
    d = r["result"]["dynamic_sampling"]
    mc = d["mean_curve"]
    rows = d["seeds"]
    out = [
        f"## Dynamic sampling ({d['mode']}): trainer steps to the baseline's reward",
        "",
        f"`{r['command']}` ({r['when']}, load {r['load_avg_1m']}): per seed, `{d['config']}` as shipped "
        f"({d['mode']}) and with `algorithm.dynamic_sampling = true` (oversample {d['oversample']:g}, up to "
        f"{d['max_rounds']} refill rounds). Reward: every response a step sampled, trailing mean of {d['window']} "
        "steps; target: the baseline's at its last step (docs/algorithms.md, Dynamic sampling).",
        "",
        "| seed | target | steps without | steps with | reward at the last step, without / with | filtered_frac "
        "| mean staleness, without / with |",
        "|---|---|---|---|---|---|---|",
    ]
    out += [
        f"| {x['seed']} | {x['target']:.3f} | {x['base_steps']} | {x['dynamic_steps']} | "
        f"{x['target']:.3f} / {x['dynamic_final']:.3f} | {x['filtered_frac_mean']:.2f} | "
        f"{x['base_staleness_mean']:.3f} / {x['dynamic_staleness_mean']:.3f} |"
        for x in rows
    ]
    higher = sum(x["dynamic_final"] > x["target"] for x in rows)
    out += [
        "",
        f"- Each seed against its own baseline (the baseline counted at the first step its curve reaches its own "
        f"last value): {d['base_steps_mean']:.1f} -> {d['dynamic_steps_mean']:.1f} steps, "
        f"**{d['fewer_steps']:.1%} fewer**.",
        f"- The mean curves of the {len(rows)} seeds (target: the mean baseline's reward at its last step, "
        f"{mc['target']:.3f}): {mc['base_steps']} -> {mc['dynamic_steps']} steps, **{mc['fewer_steps']:.1%} fewer**; "
        f"reward at the last step {mc['target']:.3f} -> {mc['dynamic_final']:.3f}.",
        f"- Reward at the last step higher with dynamic sampling on {higher} seeds of {len(rows)}.",
        "",
    ]
    return out


def _render_agent(r: dict) -> list[str]:
    a, t = r["result"]["agent"], r["result"]["trainer"]
    return [
        "## An agent written without asyncflow learns through the gateway",
        "",
        f"`{r['command']}` ({r['when']}, load {r['load_avg_1m']}): `examples/agent/agent.py`, a plain `openai`-client "
        "program in its own process, multiplies two-digit numbers with a calculator tool it runs itself, 8 attempts "
        "per problem under one group key, and posts each episode's reward; `examples/agent/agent.toml` trains the "
        "warm-started tiny model on the rewarded sessions (docs/gateway.md, Training on sessions).",
        "",
        "| | first 10% | last 10% | ratio |",
        "|---|---|---|---|",
        f"| the agent's reward, episodes in finishing order ({a['episodes']}) | {a['reward_first_10pct']:.3f} | "
        f"{a['reward_last_10pct']:.3f} | {a['ratio']}x |",
        f"| the trainer's `reward_mean`, steps ({t['steps']}) | {t['reward_first_10pct_steps']:.3f} | "
        f"{t['reward_last_10pct_steps']:.3f} | |",
        "",
        f"Sessions trained: {t['sessions_trained']}; dropped as too stale for the step (`stale_sessions`): "
        f"{t['sessions_stale']}; staleness at most {t['staleness_max']:.0f}; {r['result']['wall_s']} s wall.",
    ]


def _render_planner_rounds(r: dict) -> list[str]:
    p = r["result"]
    ratios = p["ratios"]
    slower = [x for x in ratios if x < 1.0]
    moved = sum(1 for x in p["rounds"] if x["moves"])
    still = [x["ratio"] for x in p["rounds"] if not x["moves"]]
    out = [
        "## The online planner, round by round (issue 31 item 6)",
        "",
        f"`{r['command']}` ({r['when']}, load {r['load_avg_1m']}, {r['seconds'] / 60:.0f} min): `examples/unbalanced.toml` "
        "as shipped (one rollout replica generating 48 tokens a sample, a cheap trainer, 300 steps, weights that stay "
        "put so that both runs generate the same work, `planner.move_cost_s` as measured on this box) with "
        "`[planner] online` on and off, "
        "whole runs one after the other, the order alternating round by round. A move is made only when it repays "
        "its cost over the steps left, and one that slowed the run is reverted (docs/planner.md, 'What a move costs').",
        "",
        "| round | order | samples/s, online | static | online / static | moves (predicted gain, cost) | measured | reverted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in p["rounds"]:
        out.append(
            f"| {x['round']} | {' then '.join(x['order'])} | {x['online_samples_per_s']:.2f} | "
            f"{x['static_samples_per_s']:.2f} | **{x['ratio']:.2f}** | {'; '.join(x['moves']) or 'none'} | "
            f"{'; '.join(x['measured']) or '-'} | {x['reverted']} |"
        )
    median = sorted(ratios)[len(ratios) // 2]
    out += [
        "",
        f"Online / static over the whole run: slowest round {min(ratios):.2f}x, median {median:.2f}x, fastest "
        f"{max(ratios):.2f}x; the planner moved in {moved} of {len(ratios)} rounds. "
        + (
            "No round was slower with the planner on (target: none)."
            if not slower
            else f"{len(slower)} round(s) came out slower with the planner on (target: none): "
            + ", ".join(f"{x:.2f}x" for x in slower)
            + "."
        )
        + (
            f" In the {len(still)} round(s) where the planner made no move (the two runs are then the same config), "
            f"online / static ranged {min(still):.2f}x to {max(still):.2f}x: the spread of two runs one after the other."
            if still
            else ""
        )
        + (
            f' Why the planner held, round 1: "{p["rounds"][0]["held"][0]}" (a net of minus the whole cost: the '
            "move would not be in place before the run's end; a longer run, `--steps`, gives it the steps to pay)."
            if p["rounds"][0]["held"] and not p["rounds"][0]["moves"]
            else ""
        ),
        "",
    ]
    return out


def _render_sticky(r: dict) -> list[str]:
    x = r["result"]
    out = [
        "## Gateway sessions over several replicas: sticky routing and the prefix cache",
        "",
        f"`{r['command']}` ({r['when']}, load {r['load_avg_1m']}): {x['sessions']} agents of {x['turns']} turns each "
        f"(the tiny model, {x['tokens']}-token replies) through the front over in-process replicas, each with its own "
        "native engine, routed sticky (a session's turns on one replica: how a run routes) and round robin (every "
        "request to the next replica; only possible here, where the replicas share one session store). 'Already run': "
        "the prompt tokens the replica had run for the session before (`gateway/prefix_reused_tokens`); 'served by the "
        "cache': those its prefix cache served (`gateway/prefix_cached_tokens`: whole 16-token blocks, also of other "
        "sessions' identical prefixes such as the chat template's system prompt; docs/gateway.md).",
        "",
        "| replicas | routing | prompt tokens | already run on the replica | served by the prefix cache |",
        "|---|---|---|---|---|",
    ]
    for run in x["runs"]:
        out.append(
            f"| {run['replicas']} | {run['policy'].replace('_', ' ')} | {run['prompt_tokens']} | {run['reused_tokens']} "
            f"({100 * run['reused_fraction']:.1f}%) | {run['cached_tokens']} ({100 * run['cached_fraction']:.1f}%) |"
        )
    out += [
        "",
        "Sticky routing keeps everything reusable (the first turn of a session has nothing before it: about 80% is "
        "this workload's ceiling); round robin keeps about one turn in `replicas` on the replica that ran the turn "
        "before. "
        + (
            "The cache serves whole blocks only: here less than was run in every row."
            if all(run["cached_tokens"] <= run["reused_tokens"] for run in x["runs"])
            else "The cache serves whole blocks only, but also other sessions' identical prefixes: in some rows more "
            "than was run for the session."
        ),
    ]
    return out


def _render_hub(r: dict) -> list[str]:
    h = r["result"]
    calls = ""
    if "tool_call_rate_first_10pct" in h:
        calls = (
            f"| the environment's tool-call rate | {h['tool_call_rate_first_10pct']:.3f} | "
            f"{h['tool_call_rate_last_10pct']:.3f} | |"
        )
    return [
        "## An environment from a hub trains",
        "",
        f"`{r['command']}` ({r['when']}, load {r['load_avg_1m']}): `examples/hub/hub.toml`, the calculator task written "
        f"as an OpenEnv environment (`examples/hub/calc_openenv.py`, {h['env']}) and run through asyncflow's OpenEnv "
        "adapter (`asyncflow/envs/hub/openenv.py`; docs/environments.md, Hub environments), trains the warm-started "
        f"tiny model: {h['steps']} steps, async (k = 1), {h['wall_s']} s wall.",
        "",
        "| | first 10% of steps | last 10% | ratio |",
        "|---|---|---|---|",
        f"| the trainer's `reward_mean` | {h['reward_first_10pct']:.3f} | {h['reward_last_10pct']:.3f} | {h['ratio']}x |",
        *([calls] if calls else []),
        "",
        f"The environment's error rate was at most {h['env_error_rate_max']:.3f} per step.",
    ]


BLOCKS = {
    "algorithms": _render_algorithms,
    "planner_rounds": _render_planner_rounds,
    "twin": _render_twin,
    "queue_scale": _render_queue_scale,
    "trace_cost": _render_trace_cost,
    "fanout": _render_fanout,
    "fanout_link": _render_fanout_link,
    "agent": _render_agent,
    "sticky": _render_sticky,
    "hub": _render_hub,
    "parity_stream": _parity_stream,
}
"""Sections of docs/results.md in a marked block of their own: measured alone (``--only``), their block is
rewritten in the page as it stands when the JSON of the others is not at hand."""
INLINE_BLOCKS = {"parity": _render_parity}
"""Blocks that ``render`` places in the page's order (the first section), not at its end."""
BLOCKS = {**BLOCKS, **INLINE_BLOCKS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="runs/results", help="where each section's JSON (and runs) are kept")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=sorted(SECTIONS),
        help="measure these sections again (and no other); only their pages are rewritten",
    )
    parser.add_argument("--render", action="store_true", help="measure nothing; write the page from the kept JSON")
    parser.add_argument(
        "--keep-runs",
        action="store_true",
        help="read the runs a measurement left finished in --work (after an interruption) instead of starting them "
        "again (the real-model sections, parity, algorithms, dynamic_sampling); without it every section named by "
        "--only starts from an empty directory",
    )
    parser.add_argument("--out", default="docs/results.md")
    parser.add_argument("--performance-out", default="docs/performance.md")
    parser.add_argument("--real-out", default="docs/real-model.md")
    args = parser.parse_args()
    work = (ROOT / args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    records = {}
    for name in SECTIONS:
        path = work / f"{name}.json"
        if not path.exists():
            path = ROOT / DATA_DIR / f"{name}.json"
        fresh = args.only is not None and name in args.only
        if path.exists() and not fresh:
            records[name] = json.loads(path.read_text())
        elif not args.render and ((args.only is None and name not in REAL) or fresh):  # real-model runs: only when named
            if fresh and not args.keep_runs:
                # a run left by an older measurement would be read as this one's (the real-model check reads a
                # finished run instead of starting it: --keep-runs continues an interrupted measurement)
                import shutil

                shutil.rmtree(work / name, ignore_errors=True)
            records[name] = measure(name, work)
    from performance_page import render_performance
    from real_model_page import render_real

    if args.render or (args.only is not None and any(n in REAL for n in args.only)):  # its own page, what is measured so far
        real = {k: v for k, v in records.items() if k in REAL}
        commands = {n: shlex.join(["python" if c == PY else c.format(work=args.work) for c in SECTIONS[n]]) for n in REAL}
        page = ROOT / args.real_out
        page.write_text(render_real(real, commands, page.read_text() if page.exists() else "") + "\n")
        print(f"wrote {args.real_out} from {', '.join(real) or 'nothing yet'}", file=sys.stderr)
    # docs/performance.md: section by section, a section without JSON keeps its text from the page as it stands
    perf = {k: v for k, v in records.items() if k in PERFORMANCE or k in REAL_PERFORMANCE or k == "parity"}
    if args.render or args.only is None or any(n in PERFORMANCE or n in REAL_PERFORMANCE for n in args.only):
        page = ROOT / args.performance_out
        page.write_text(render_performance(perf, page.read_text() if page.exists() else "") + "\n")
        print(f"wrote {args.performance_out} from {', '.join(perf) or 'nothing yet'}", file=sys.stderr)
    records = {k: v for k, v in records.items() if k not in REAL}
    results = {k: v for k, v in records.items() if k not in PERFORMANCE}
    sections = [n for n in SECTIONS if n not in PERFORMANCE and n not in REAL]
    if args.only is None or any(n in args.only for n in sections):
        missing = [n for n in sections if n not in results]
        page = ROOT / args.out
        blocks = [n for n in BLOCKS if n in results and (args.render or args.only is None or n in args.only)]
        if missing and blocks and page.exists():  # the page as it stands, with these sections' blocks rewritten
            text = page.read_text()
            for name in blocks:
                text = splice_block(text, name, BLOCKS[name](results[name]))
            page.write_text(text)
            print(f"{args.out}: rewrote the blocks of {', '.join(blocks)}; no JSON for {', '.join(missing)}", file=sys.stderr)
        elif missing:  # docs/results.md is written whole or not at all
            print(
                f"{args.out} not rewritten: no JSON in {work} for {', '.join(missing)} (measure them with --only)",
                file=sys.stderr,
            )
        else:
            (ROOT / args.out).write_text(render(results) + "\n")
            print(f"wrote {args.out} from {', '.join(results)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
