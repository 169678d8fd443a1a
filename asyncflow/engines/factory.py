"""Build engines from their configs: the only place that names concrete engines.

Actors call ``build_rollout_engine`` / ``build_train_engine`` / ``build_reward_scorer``
and hold the result as a ``RolloutEngine`` / ``TrainEngine`` / ``RewardScorer``. Implementations are imported on demand, so
vLLM, torch_npu and friends load only when a config asks for them.
"""

from __future__ import annotations

import json
from pathlib import Path

from asyncflow.engines.base import RewardScorer, RolloutEngine, TrainEngine
from asyncflow.engines.config import VLLM_TYPES, Device, DType, RolloutEngineConfig, TrainEngineConfig


def build_rollout_engine(cfg: RolloutEngineConfig, model_dir: str | Path, version: int = 0) -> RolloutEngine:
    """A rollout engine of ``cfg.type`` (``auto``: ``resolve_rollout_type``'s) holding the
    weights in ``model_dir`` as policy ``version``."""
    kind, _ = resolve_rollout_type(cfg.type, model_dir)
    if kind == "native":
        from asyncflow.engines.native_rollout import NativeRolloutEngine

        return NativeRolloutEngine(cfg, model_dir, version=version)
    if kind == "hf":
        from asyncflow.engines.hf_rollout import HFRolloutEngine

        return HFRolloutEngine(cfg, model_dir, version=version)
    if kind in VLLM_TYPES:
        from asyncflow.engines.vllm_rollout import VLLMRolloutEngine

        return VLLMRolloutEngine(cfg, model_dir, version=version)
    if kind == "emulated":
        from asyncflow.engines.emulated_rollout import EmulatedRolloutEngine

        return EmulatedRolloutEngine(cfg, model_dir, version=version)
    raise ValueError(f"unknown rollout engine type {cfg.type!r}; use 'auto', 'native', 'hf', 'vllm', 'vllm_ascend' or 'emulated'")


def resolve_rollout_type(kind: str, model_dir: str | Path) -> tuple[str, str]:
    """The rollout engine type a config's ``kind`` builds for ``model_dir``, and why, in
    words for the run's first lines. ``auto``: native where ``engines/families`` implements
    the model (read from ``model_dir/config.json``, no weights), else hf with the
    families' reason; any other type is itself."""
    if kind != "auto":
        return kind, f'rollout.engine.type = "{kind}"'
    from asyncflow.engines.families import why_not_native

    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{model_dir} is not a Hugging Face model directory (no config.json); "
            "point model_dir at a local directory saved with save_pretrained"
        )
    config = json.loads(path.read_text())
    reason = why_not_native(config)
    if reason is None:
        return "native", f"model_type {config.get('model_type')!r}"
    return "hf", reason


def build_train_engine(cfg: TrainEngineConfig, model_dir: str | Path, total_steps: int = 0) -> TrainEngine:
    """A training engine of ``cfg.type`` starting from ``model_dir``, for a run of
    ``total_steps`` optimizer steps (the length of a cosine lr schedule; 0 when
    unknown, which only ``lr_schedule = "constant"`` accepts). With ``cfg.fsdp`` the
    default process group must already be initialised on every rank
    (``asyncflow.engines.device.init_process_group``)."""
    if cfg.type == "torch":
        from asyncflow.engines.torch_train import TorchTrainEngine

        return TorchTrainEngine(cfg, model_dir, total_steps=total_steps)
    if cfg.type == "emulated":
        from asyncflow.engines.emulated_train import EmulatedTrainEngine

        return EmulatedTrainEngine(cfg, model_dir, total_steps=total_steps)
    raise ValueError(f"unknown train engine type {cfg.type!r}; use 'torch' or 'emulated'")


def build_reward_scorer(
    kind: str,
    model_dir: str | Path,
    *,
    device: Device = "cpu",
    dtype: DType = "float32",
    batch_size: int = 16,
    template: str = "{prompt}{response}",
    max_new_tokens: int = 8,
    default: float = 0.0,
) -> RewardScorer:
    """A reward model in ``model_dir``: ``kind`` 'classifier' (a sequence classifier's
    head) or 'judge' (a causal LM's verdict on ``template``, parsed to a number)."""
    from asyncflow.engines.reward_model import ClassifierScorer, JudgeScorer

    if kind == "classifier":
        return ClassifierScorer(model_dir, device=device, dtype=dtype, batch_size=batch_size)
    if kind == "judge":
        engine = build_rollout_engine(RolloutEngineConfig(device=device, dtype=dtype, max_batch_size=batch_size), model_dir)
        return JudgeScorer(engine, model_dir, template, max_new_tokens=max_new_tokens, default=default)
    raise ValueError(f"unknown reward model kind {kind!r}; use 'classifier' or 'judge'")
