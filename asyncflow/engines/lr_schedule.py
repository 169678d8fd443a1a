"""The learning rate of each optimizer step: linear warmup, then constant or cosine.

Invariant: the lr is a pure function of (config, optimizer step, total steps). It
keeps no state of its own, so a run resumed from a checkpoint (which restores the
step count) continues the schedule exactly, and every FSDP rank (same step count)
uses the same lr.
"""

from __future__ import annotations

import math

from asyncflow.engines.config import TrainEngineConfig


def lr_at(cfg: TrainEngineConfig, step: int, total_steps: int) -> float:
    """The lr of optimizer step ``step`` (0-based) of a run of ``total_steps`` steps.

    Warmup: step k < W uses ``lr * (k + 1) / W``. Cosine: from ``lr`` at step W down
    to ``lr * lr_min_ratio`` at step ``total_steps - 1``, and that minimum beyond.
    With ``lr_schedule_convention = "huggingface"``, transformers' schedulers: warmup
    ``lr * k / W``, and the cosine reaches its minimum at step ``total_steps``."""
    warmup = cfg.lr_warmup_steps
    hf = cfg.lr_schedule_convention == "huggingface"
    if step < warmup:
        return cfg.lr * (step if hf else step + 1) / warmup
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if total_steps <= 0:
        raise ValueError(
            "lr_schedule = 'cosine' needs the run's number of optimizer steps: build the engine with "
            "total_steps (build_train_engine(cfg, model_dir, total_steps=...)), or use lr_schedule = 'constant'"
        )
    span = total_steps - warmup - (0 if hf else 1)
    progress = 1.0 if span <= 0 else min(1.0, (step - warmup) / span)
    low = cfg.lr * cfg.lr_min_ratio
    return low + (cfg.lr - low) * 0.5 * (1.0 + math.cos(math.pi * progress))
