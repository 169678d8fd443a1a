"""A PolicyUpdate on the tiny model, and queue-like columns for it, without a run."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from tiny_config import tiny_config_text

from asyncflow.actors.runtime.run_dir import LaunchInfo
from asyncflow.actors.trainer.policy import PolicyUpdate
from asyncflow.config.load import load_config_text


def policy_update(model_dir: Path, changes: dict[str, dict[str, Any]]) -> PolicyUpdate:
    """PolicyUpdate of examples/tiny.toml with ``changes`` (``{"algorithm": {...}}``)."""
    cfg = load_config_text(tiny_config_text(changes))
    launch = LaunchInfo(model_dir=str(model_dir), base_model_dir=str(model_dir), data_path="")
    return PolicyUpdate(SimpleNamespace(config=cfg, launch=launch))


def columns(
    prompts: list[list[int]],
    responses: list[list[int]],
    rewards: list[float],
    rollout_logp: list[list[float]],
    ref_logp: list[list[float]] | None = None,
    truncated: list[bool] | None = None,
) -> dict[str, list]:
    """Rows as the trainer reads them from the queue (``truncated[b]``: row b was cut
    at max_new_tokens, its ``finish`` is 0; default: every row stopped)."""
    out = {
        "prompt_ids": [np.array(p, dtype=np.int64) for p in prompts],
        "response_ids": [np.array(r, dtype=np.int64) for r in responses],
        "rollout_logp": [np.array(lp, dtype=np.float32) for lp in rollout_logp],
        "reward": [np.array([r], dtype=np.float32) for r in rewards],
        "finish": [np.array([0 if cut else 1], dtype=np.uint8) for cut in (truncated or [False] * len(prompts))],
    }
    if ref_logp is not None:
        out["ref_logp"] = [np.array(lp, dtype=np.float32) for lp in ref_logp]
    return out
