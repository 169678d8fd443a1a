"""``afctl bench``: benchmarks that print figures (ratios measured side by side)."""

from __future__ import annotations

import click

from asyncflow.cli._lazy import LazyGroup

BENCHES = {
    "transport": ("asyncflow.bench.transport:transport", "nng request/reply round trip and bandwidth."),
    "queue": ("asyncflow.bench.queue:queue", "TransferQueue put/get across processes."),
    "rollout": ("asyncflow.bench.rollout:rollout", "Native rollout engine vs Hugging Face generate."),
    "decode": (
        "asyncflow.bench.decode:decode",
        "The native engine's decode step, eager vs compiled (rollout.engine.compile): ms/step per rows, compile time.",
    ),
    "prefix": (
        "asyncflow.bench.prefix:prefix",
        "Multi-turn conversations on the native engine, its prefix cache on vs off: time and prompt tokens run.",
    ),
    "train": (
        "asyncflow.bench.train:train",
        "Training tokens/s, one process and two-process FSDP2; --packing: packing on vs off.",
    ),
    "e2e": ("asyncflow.bench.e2e:e2e", "A config end to end, sync vs async, side by side."),
    "weights": (
        "asyncflow.bench.weights:weights",
        "Weight fetch bytes/s: nng chunks, local (/dev/shm, CUDA IPC) and the collective, side by side.",
    ),
    "fanout": (
        "asyncflow.bench.fanout:fanout",
        "Weight fan-out to n replicas: trainer bytes and time to the last replica, direct vs relay tree.",
    ),
    "lora": ("asyncflow.bench.lora:lora", "Bytes per weight sync and sync time: full weights vs LoRA adapters."),
    "planner": (
        "asyncflow.bench.planner:planner",
        "An unbalanced run rebalanced by the online planner: first vs last samples/s.",
    ),
    "peer": ("asyncflow.bench.peer:peer", "TRL GRPOTrainer vs asyncflow sync and async on the same task (the bench extra)."),
}


@click.group(cls=LazyGroup, lazy_commands=BENCHES)
def bench() -> None:
    """Benchmarks that print figures; `--json` makes the last line one JSON object."""
