"""The run directory and what every role reads from it at start.

    RUN_DIR/
      config.json          the resolved RunConfig
      launch.json          this launch: model dir, data file, start step (LaunchInfo)
      model/ data.jsonl    the tiny model and task data, when the config builds them
      metrics.jsonl        one object per trainer step
      checkpoints/step_N/  Hugging Face model + optimizer, queue/, roles.msgpack
      summary.json         written at the end
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec

from asyncflow.core.config import RunConfig


class LaunchInfo(msgspec.Struct, kw_only=True):
    model_dir: str  # weights every role starts from (a checkpoint on resume)
    base_model_dir: str  # the original model (reference policy)
    data_path: str
    start_step: int = 0  # first trainer step of this launch (= policy version held)
    resume_from: str = ""  # checkpoint directory, when resuming
    role_states: dict[str, bytes] = {}  # resumable state per role (from the checkpoint)


class Run:
    """Everything a role process needs to know about the run."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir)
        self.config = msgspec.json.decode((self.dir / "config.json").read_bytes(), type=RunConfig)
        self.launch = msgspec.json.decode((self.dir / "launch.json").read_bytes(), type=LaunchInfo)

    def role_state(self, role: str) -> bytes:
        return self.launch.role_states.get(role, b"")

    def tokenizer(self):
        from asyncflow.engines.hf import load_tokenizer

        return load_tokenizer(self.launch.base_model_dir)


def set_threads(config: RunConfig) -> None:
    """One process per role on a few cores: bound torch's intra-op threads."""
    import torch

    torch.set_num_threads(max(1, config.cluster.threads_per_process))


def read_prompts(path: str) -> list[dict]:
    """Rows with ``prompt`` and ``answer`` from a .jsonl or .parquet file."""
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise RuntimeError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow), or convert it to JSONL") from None
        rows = pq.read_table(path).to_pylist()
    else:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    for i, row in enumerate(rows):
        if "prompt" not in row or "answer" not in row:
            raise ValueError(f"{path}: row {i} lacks 'prompt' or 'answer' (has {sorted(row)}); every row needs both")
    if not rows:
        raise ValueError(f"{path} has no rows")
    return rows
