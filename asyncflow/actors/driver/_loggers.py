"""Metric loggers beside metrics.jsonl: TensorBoard and Weights & Biases (optional extras).

The collector calls ``log(step, values)`` for every trainer step (the same object
it appends to metrics.jsonl); the driver calls ``close()`` at the end of the run.
Names are the metrics.jsonl names (docs/metrics.md); ``busy/<role>`` groups the busy
fractions in one TensorBoard section.
"""

from __future__ import annotations

from pathlib import Path

from asyncflow.config.cluster import LoggingConfig
from asyncflow.config.run import RunConfig


class TensorBoardLogger:
    """Event files under RUN_DIR/tensorboard (``tensorboard --logdir RUN_DIR/tensorboard``)."""

    def __init__(self, log_dir: str | Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise RuntimeError(
                "[logging] tensorboard = true needs the tensorboard package: pip install -e '.[tensorboard]' (in the asyncflow checkout) "
                "(or set [logging] tensorboard = false)"
            ) from None
        self.log_dir = str(log_dir)
        self._writer = SummaryWriter(log_dir=self.log_dir)

    def log(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbLogger:
    """One W&B run per asyncflow run, named after the run directory, config attached."""

    def __init__(self, project: str, run_dir: str | Path, config: dict | None = None):
        try:
            import wandb
        except ImportError:
            raise RuntimeError(
                f"[logging] wandb_project = {project!r} needs the wandb package: pip install -e '.[wandb]' (in the asyncflow checkout) "
                "(or remove [logging] wandb_project)"
            ) from None
        self._run = wandb.init(project=project, name=Path(run_dir).name, dir=str(run_dir), config=config or {})

    def log(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=step)

    def close(self) -> None:
        self._run.finish()


def build_loggers(logging: LoggingConfig, run_dir: str | Path, config: RunConfig | None = None) -> list:
    """The loggers ``[logging]`` asks for (an empty list by default)."""
    loggers: list = []
    if logging.tensorboard:
        loggers.append(TensorBoardLogger(Path(run_dir) / "tensorboard"))
    if logging.wandb_project:
        import msgspec

        as_dict = msgspec.to_builtins(config) if config is not None else None
        loggers.append(WandbLogger(logging.wandb_project, run_dir, as_dict))
    return loggers
