"""Before launch: will the run fit in memory? Say so now, not as an OOM an hour in.
And (``check_inputs``) will its workers start: the reward functions and custom roles
import, the devices exist, the data has its fields, the model has a chat template.

The estimate counts what each process holds for the whole run: the trainer's model
states (weights, gradients, AdamW moments at the parameter dtype; twice with a PPO
critic), a reference copy of the weights, each rollout replica's weights and its
KV-cache budget, each reward-model replica's weights (and a judge's KV cache).
With LoRA (``train.engine.lora.rank > 0``) the trainer holds the weights of every
parameter (base + adapters) but gradients and AdamW moments of the trainable ones
only (adapters, + the norms with ``train_norms``), and a weight sync stages only
those (``planner.models.trainable_params``); a native replica also keeps the base
copy of each adapted weight, to merge each new adapter onto.
Activations are excluded (they depend on micro-batch sizes), so it is a lower bound.
On cpu every process shares the host's memory, compared with MemAvailable; on
accelerators the per-device figures are printed for the user to compare with the
devices (or with `afctl plan`, which models activations too).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from asyncflow.config.run import ConfigError, RunConfig

if TYPE_CHECKING:
    from asyncflow.planner.models import Lora, ModelShape

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_GIB = 1 << 30


def _available_host_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def trainer_state_bytes(shape: ModelShape, lora: Lora, dtype_bytes: int) -> int:
    """A trained model's state at the parameter dtype: the weights of every parameter
    (base + adapters), and a gradient and two AdamW moments per trainable one. Without
    LoRA: 4 x params x dtype_bytes."""
    from asyncflow.planner.models import total_params, trainable_params

    return dtype_bytes * (total_params(shape, lora) + 3 * trainable_params(shape, lora))


def adapted_weight_params(shape: ModelShape, lora: Lora) -> int:
    """Parameters of the weights LoRA adapts (0 without LoRA)."""
    from asyncflow.planner.models import linear_features

    if lora.rank == 0:
        return 0
    return shape.num_layers * sum(i * o for i, o in (linear_features(shape, m) for m in lora.target_modules))


def estimate(cfg: RunConfig, model_dir: str, reward_model_dir: str = "") -> dict[str, float]:
    """Bytes per process role (lower bound: no activations). ``reward_model_dir``: the
    reward-model role's model (empty: the policy's, which a judge without a path uses)."""
    from asyncflow.planner.io import from_hf_config
    from asyncflow.planner.models import Lora, trainable_params

    shape = from_hf_config(Path(model_dir) / "config.json")
    params = shape.num_params
    lora = Lora.of(cfg.train.engine.lora)
    synced = trainable_params(shape, lora)  # what a weight sync carries: every weight, or the adapters (+ norms)
    train_b = _DTYPE_BYTES[cfg.train.engine.dtype]
    rollout_b = _DTYPE_BYTES[cfg.rollout.engine.dtype]
    kv = cfg.rollout.engine.kv_cache_bytes or (64 << 20 if cfg.rollout.engine.kv_cache_fraction is None else 0)
    trainer = trainer_state_bytes(shape, lora, train_b)
    if cfg.algorithm.name == "ppo":
        trainer += trainer_state_bytes(shape, Lora.of(cfg.critic.engine.lora), train_b)
    ranks = cfg.train.num_ranks  # FSDP2 shards that state over the ranks
    out = {"trainer": trainer / ranks + synced * 4}  # + the host-staged snapshot published to rollout (fp32 on cpu)
    for r in range(1, ranks):
        out[f"trainer.{r}"] = trainer / ranks
    # a native replica keeps the base of each adapted weight beside the merged one (engines/native_rollout.py)
    base_copies = adapted_weight_params(shape, lora) if cfg.rollout.engine.type == "native" else 0
    for i in range(cfg.rollout.num_replicas):
        # weights + KV budget + the staged next version (+ the LoRA base copies)
        out[f"rollout.{i}"] = params * rollout_b + kv + synced * 4 + base_copies * rollout_b
    if cfg.algorithm.kl_coef > 0:
        for i in range(cfg.reference.num_workers):
            out[f"reference.{i}"] = params * train_b
    rm = cfg.reward_model
    if rm.enabled:
        rm_params = from_hf_config(Path(reward_model_dir) / "config.json").num_params if reward_model_dir else params
        judge_kv = 64 << 20 if rm.kind == "judge" else 0  # the native engine's default KV-cache budget
        for i in range(rm.num_replicas):
            out[f"reward_model.{i}"] = rm_params * _DTYPE_BYTES[rm.dtype] + judge_kv
    return out


def check(cfg: RunConfig, model_dir: str, reward_model_dir: str = "") -> str:
    """One line to print; raises ConfigError when a cpu run cannot fit in host memory."""
    per_role = estimate(cfg, model_dir, reward_model_dir)
    total = sum(per_role.values())
    detail = ", ".join(f"{k} {v / _GIB:.2f}" for k, v in per_role.items())
    if cfg.cluster.device == "cpu":
        available = _available_host_bytes()
        if available is not None and total > available:
            raise ConfigError(
                f"the run needs at least {total / _GIB:.1f} GiB of host memory ({detail} GiB, activations not "
                f"counted) but {available / _GIB:.1f} GiB is available: use a smaller model, fewer "
                f"rollout.num_replicas (or reward_model.num_replicas), a smaller rollout.engine.kv_cache_bytes, or "
                "bfloat16 weights"
            )
        if available is None:  # this system does not say (no /proc/meminfo)
            return f"memory: at least {total / _GIB:.2f} GiB ({detail} GiB)"
        return f"memory: at least {total / _GIB:.2f} GiB of {available / _GIB:.1f} GiB available ({detail} GiB)"
    return f"memory per device, at least (activations not counted): {detail} GiB"


# -- inputs: what a worker would otherwise find out after the processes started ----------


def _importable(path: str, python_path: list[str]):
    """``module:attr`` imported the way a worker will (PYTHONPATH = cluster.python_path,
    then the working directory); raises ValueError saying what is missing."""
    import importlib
    import sys

    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{path!r} is not a dotted path 'package.module:name'")
    saved = list(sys.path)
    sys.path[:0] = [*python_path, os.getcwd()]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        where = ", ".join(python_path) if python_path else "nothing"
        raise ValueError(
            f"cannot import module {module_name!r} ({exc}); put the directory that holds it in "
            f"cluster.python_path (relative to the config file; now {where})"
        ) from None
    finally:
        sys.path[:] = saved
    if not hasattr(module, attr):
        raise ValueError(f"module {module_name!r} ({getattr(module, '__file__', '?')}) has no {attr!r}")
    return getattr(module, attr)


def check_inputs(cfg: RunConfig) -> None:
    """Everything a worker process would fail on at start, checked in the driver before
    any process starts (and before the run directory is made); a ConfigError names
    the key and the fix. The built-in tiny model and task need no data or template check."""
    from asyncflow.algorithms.rewards import BUILTIN_REWARDS, load_reward_fn

    for i, name in enumerate(cfg.reward.functions):
        if name in BUILTIN_REWARDS:
            continue
        key = f"reward.functions[{i}] = {name!r}"
        if ":" not in name:
            raise ConfigError(
                f"{key}: use a built-in ({', '.join(sorted(BUILTIN_REWARDS))}) or a dotted path "
                "'package.module:function' (docs/your-model-and-data.md, 'Your reward')"
            )
        try:
            _importable(name, cfg.cluster.python_path)
            load_reward_fn(name)  # its signature (the module is imported now)
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc}") from None
    if cfg.env.path:
        from asyncflow.envs.base import load_env_factory

        try:
            _importable(cfg.env.path, cfg.cluster.python_path)  # imported now: the factory's module is loaded
            load_env_factory(cfg.env.path)  # makes one: it is an Environment
        except ValueError as exc:
            raise ConfigError(f"env.path = {cfg.env.path!r}: {exc}") from None
    for i, role in enumerate(cfg.roles):
        key = f"roles[{i}].cls = {role.cls!r}"
        try:
            cls = _importable(role.cls, cfg.cluster.python_path)
        except ValueError as exc:
            raise ConfigError(f"{key} (role {role.name!r}): {exc}") from None
        from asyncflow.actors.column_role import ColumnRole
        from asyncflow.core.actor import Actor
        from asyncflow.core.host import class_path

        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise ConfigError(
                f"{key} (role {role.name!r}): not an asyncflow Actor subclass; subclass "
                f"{class_path(ColumnRole)} (docs/custom-roles.md)"
            )
    _check_devices(cfg)
    data_path, model_dir = cfg.data.path, cfg.model.path
    if data_path:
        from asyncflow.actors._run import read_prompts

        try:
            read_prompts(data_path)
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"data.path = {data_path!r}: {exc} (fields: docs/your-model-and-data.md)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"data.path = {data_path!r}: not JSON lines ({exc}); write one JSON object per line with 'prompt' and 'answer'"
            ) from None
    if cfg.data.chat_template and model_dir:
        from asyncflow.engines.hf import load_tokenizer

        if not getattr(load_tokenizer(model_dir), "chat_template", None):
            raise ConfigError(
                f"data.chat_template = true, but the tokenizer of {model_dir} has no chat template: set "
                "data.chat_template = false (prompts go to the model as plain text), or give the tokenizer a "
                "template (tokenizer.chat_template = '...'; tokenizer.save_pretrained(model_dir))"
            )


def _check_devices(cfg: RunConfig) -> None:
    used = [
        ("cluster.device", cfg.cluster.device),
        ("rollout.engine.device", cfg.rollout.engine.device),
        ("train.engine.device", cfg.train.engine.device),
    ]
    if cfg.algorithm.name == "ppo":
        used.append(("critic.engine.device", cfg.critic.engine.device))
    kinds = {device for _, device in used}
    if "cuda" in kinds:
        import torch

        if not torch.cuda.is_available():
            key = next(k for k, d in used if d == "cuda")
            raise ConfigError(
                f"{key} = 'cuda', but torch sees no CUDA device here (torch {torch.__version__}, "
                "torch.cuda.is_available() is False): use 'cpu', or run on a machine with a GPU and a "
                "CUDA build of torch"
            )
    if "npu" in kinds:
        import importlib.util

        if importlib.util.find_spec("torch_npu") is None:
            key = next(k for k, d in used if d == "npu")
            raise ConfigError(
                f"{key} = 'npu', but torch_npu is not installed: use 'cpu', or install torch_npu on an Ascend machine (extra npu)"
            )
