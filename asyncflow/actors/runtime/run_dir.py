"""The run directory and what every role reads from it at start.

    RUN_DIR/
      config.json          the resolved RunConfig, without the cluster secret
      secret               the cluster secret of a config that sets one (mode 0600)
      launch.json          this launch: model dir, data file, start step (LaunchInfo)
      model/ data.jsonl    the tiny model and task data, when the config builds them
      reward_model/        the tiny reward model, when [reward_model] builds it
      metrics.jsonl        one object per trainer step
      checkpoints/step_N/  Hugging Face model + optimizer, queue/, roles.msgpack
      checkpoints/best     link to best_N/ (weights of the best evaluation, [eval]), best.json
      summary.json         written at the end

Prompts: with ``[eval] every_steps > 0`` the data file is split once, by a pure
function of (data, ``eval.num_prompts``, ``data.seed``): the loader trains on one
part only and the trainer evaluates on the other (``split_prompts``).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import msgspec

from asyncflow.config.run import RunConfig


class LaunchInfo(msgspec.Struct, kw_only=True):
    model_dir: str  # weights every role starts from (a checkpoint on resume)
    base_model_dir: str  # the original model (reference policy)
    data_path: str
    start_step: int = 0  # first trainer step of this launch (= policy version held)
    resume_from: str = ""  # checkpoint directory, when resuming
    role_states: dict[str, bytes] = {}  # resumable state per role (from the checkpoint)
    reward_model_dir: str = ""  # the reward-model role's model ([reward_model]; empty: none, or a judge on base_model_dir)
    launch: int = 0  # this launch of the run: 0 a new run, one more at each resume


class Run:
    """Everything a role process needs to know about the run."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir)
        self.config = msgspec.json.decode((self.dir / "config.json").read_bytes(), type=RunConfig)
        self.launch = msgspec.json.decode((self.dir / "launch.json").read_bytes(), type=LaunchInfo)

    def role_state(self, role: str) -> bytes:
        return self.launch.role_states.get(role, b"")

    def tokenizer(self):
        """The run's tokenizer without transformers or torch (``engines/tokenizer.py``): text
        <-> ids, the chat template, the special tokens. The loader and the reward role use it."""
        from asyncflow.engines.tokenizer import load_tokenizer

        return load_tokenizer(self.launch.base_model_dir)

    def context_tokens(self) -> int:
        """``context_tokens`` of the policy the run starts from."""
        return context_tokens(self.launch.model_dir)

    def hf_tokenizer(self):
        """transformers' own tokenizer (``AutoTokenizer``), for the roles that import
        transformers for their model anyway and hand the tokenizer to others' code (an
        environment's ``bind``, the gateway): the rollout, the trainer, the reward model."""
        from asyncflow.engines.hf import load_tokenizer

        return load_tokenizer(self.launch.base_model_dir)


def context_tokens(model_dir: str | os.PathLike) -> int:
    """A model's context: its ``max_position_embeddings`` (0 when its config does not say,
    or it has none: an emulated model). Trajectories, gateway requests and the rows the
    trainer takes stay within it."""
    from asyncflow.planner.io import read_hf_config

    if not (Path(model_dir) / "config.json").is_file():
        return 0
    positions = read_hf_config(Path(model_dir)).get("max_position_embeddings")
    return positions if isinstance(positions, int) and positions > 0 else 0


def set_threads(config: RunConfig) -> None:
    """One process per role on a few cores: bound torch's intra-op threads."""
    import torch

    torch.set_num_threads(max(1, config.cluster.threads_per_process))


def read_prompts(path: str) -> list[dict]:
    """Rows with ``prompt`` and ``answer`` from a .jsonl or .parquet file."""
    return read_prompts_located(path)[0]


def read_prompts_located(path: str) -> tuple[list[dict], list[str]]:
    """``read_prompts``, and where each row is in the file (``line 12``, ``row 3``)."""
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise RuntimeError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow), or convert it to JSONL") from None
        rows = pq.read_table(path).to_pylist()
        where = [f"row {i}" for i in range(len(rows))]
    else:
        rows, where = [], []
        with open(path, "rb") as f:
            for n, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                try:
                    rows.append(json.loads(raw.decode("utf-8")))
                except UnicodeDecodeError as exc:
                    raise ValueError(f"{path}: line {n} is not UTF-8 ({exc}); save the file as UTF-8") from None
                except json.JSONDecodeError as exc:
                    raise ValueError(
                        f"{path}: line {n} is not JSON ({exc}); write one JSON object per line with 'prompt' and 'answer'"
                    ) from None
                where.append(f"line {n}")
    for row, at in zip(rows, where):
        if not isinstance(row, dict) or "prompt" not in row or "answer" not in row:
            has = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(f"{path}: {at} lacks 'prompt' or 'answer' (has {has}); every row needs both")
        if not isinstance(row["prompt"], str):
            raise ValueError(f"{path}: {at}: 'prompt' is a {type(row['prompt']).__name__}, not a string")
        if not row["prompt"].strip():
            raise ValueError(f"{path}: {at} has an empty prompt ({row['prompt']!r}); give every row a prompt to answer")
    if not rows:
        raise ValueError(f"{path} has no rows")
    return rows, where


def split_prompts(prompts: list[str], num_heldout: int, seed: int) -> tuple[list[int], list[int]]:
    """(training rows, held-out rows) of a data file with these prompts.

    ``num_heldout`` distinct prompt texts are drawn with ``seed``; every row with one of
    them is left out of training (a prompt that repeats in the file is held out
    everywhere), and the first row of each is a held-out row. ``num_heldout = 0``:
    every row trains, none is held out. Rows keep their file order in both lists."""
    if num_heldout == 0:
        return list(range(len(prompts))), []
    distinct = list(dict.fromkeys(prompts))
    if num_heldout >= len(distinct):
        raise ValueError(
            f"eval.num_prompts = {num_heldout}: the data has only {len(distinct)} distinct prompts, so none "
            f"would be left to train on; hold out fewer (at most {len(distinct) - 1}, say {max(1, len(distinct) // 5)}), "
            "or give more data"
        )
    chosen = set(random.Random(seed * 1_000_003 + 17).sample(distinct, num_heldout))
    train = [i for i, p in enumerate(prompts) if p not in chosen]
    first: dict[str, int] = {}
    for i, p in enumerate(prompts):
        if p in chosen:
            first.setdefault(p, i)
    return train, sorted(first.values())


class PromptOrder:
    """Which prompt of a pool of ``size`` feeds group ``g`` of step ``s``: position
    ``s * prompts_per_step + g`` of an endless sequence of epochs, each a permutation
    of the pool drawn from ``seed`` (or the pool in order, without shuffle). A pure
    function of its arguments, so a resumed run continues with the same prompts.

    ``stream`` numbers independent sequences of the same pool: 0 is the loader's steps;
    1 is dynamic sampling's refill rounds (their permutations drawn from another seed,
    so a refilled step sees other prompts than the steps around it)."""

    def __init__(self, size: int, prompts_per_step: int, shuffle: bool, seed: int, stream: int = 0):
        self.size, self.prompts_per_step, self.shuffle, self.seed = size, prompts_per_step, shuffle, seed
        self.stream = stream
        self._orders: dict[int, list[int]] = {}

    def index(self, step: int, group: int) -> int:
        epoch, pos = divmod(step * self.prompts_per_step + group, self.size)
        if not self.shuffle:
            return pos
        if epoch not in self._orders:  # one permutation per epoch, drawn once
            order = list(range(self.size))
            seed = self.seed * 1_000_003 + epoch if self.stream == 0 else f"{self.seed}/{self.stream}/{epoch}"
            random.Random(seed).shuffle(order)
            self._orders = {epoch: order}
        return self._orders[epoch][pos]


def encode_prompt(tokenizer, prompt: str, chat_template: bool):
    """The prompt's token ids (int64), through the chat template when ``data.chat_template``."""
    import numpy as np

    from asyncflow.engines.prompts import prompt_ids

    return np.asarray(prompt_ids(tokenizer, prompt, chat_template), dtype=np.int64)
