"""The emulated train engine (``train.engine.type = "emulated"``): no model, no device.
``forward`` gives ``emulated_model.logp_BT`` of the batch's ids at the engine's version
(what the emulated rollout gave the same ids); ``train_step`` runs the loss on those
log-probs (through a zero-valued parameter, so the loss has a graph and a gradient),
sleeps the step time the planner's cost model gives the batch, and counts one version.
Its weights are ``emulated_model.version_weights(version)``; a checkpoint is the version,
beside the model's config.json (a resume reads the model's shape and vocabulary from the
checkpoint's model directory, as it does a real engine's).

Invariants: the loss and metrics are finite and a pure function of the batch, the loss
function and the version; the version is the number of optimizer steps taken.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from asyncflow.engines import emulated_model
from asyncflow.engines.base import ForwardOutput, LossContext, LossFn, TokenBatch, TrainEngine, TrainStepResult
from asyncflow.engines.config import TrainEngineConfig
from asyncflow.engines.lr_schedule import lr_at


class EmulatedTrainEngine(TrainEngine):
    def __init__(self, cfg: TrainEngineConfig, model_dir: str | Path, total_steps: int = 0):
        self.cfg = cfg
        self.model_dir = Path(model_dir)
        self.timing = emulated_model.Timing(cfg.emulated)
        self.total_steps = total_steps
        self._version = 0
        self.bias = torch.nn.Parameter(torch.zeros(1))
        """Zero: what the loss flows back to (the log-probs are the hash's exactly)."""
        self.sleep = emulated_model.EventSleep()
        """Called with each emulated duration in seconds (tests record them instead)."""

    def _output(self, batch: TokenBatch) -> ForwardOutput:
        logp = emulated_model.logp_BT(batch.input_ids, self._version)
        return ForwardOutput(logp=logp, entropy=-logp)

    def forward(
        self, batch: TokenBatch, temperature: float = 1.0, with_entropy: bool = False, top_k: int = 0, top_p: float = 1.0
    ) -> ForwardOutput:
        return self._output(batch)

    def train_step(
        self, batch: TokenBatch, loss_fn: LossFn, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
    ) -> TrainStepResult:
        mark = getattr(self.sleep, "mark", None)
        if mark is not None:  # the loss below is computed during the step's device time
            mark()
        out = self._output(batch)
        out.logp = out.logp + self.bias * 0.0
        num_tokens = float(batch.response_mask.sum())
        num_seqs = float((batch.response_mask.sum(dim=1) > 0).sum())
        loss, metrics = loss_fn(out, batch, LossContext(num_tokens=num_tokens, num_seqs=num_seqs))
        self.bias.grad = None
        if loss.requires_grad:
            loss.backward()
        grad = self.bias.grad
        grad_norm = float(grad.norm()) if grad is not None else 0.0
        self.sleep(self.timing.train_s(batch))
        self._version += 1
        metrics = {**metrics, "lr": lr_at(self.cfg, self._version - 1, self.total_steps)}
        return TrainStepResult(
            loss=float(loss.detach()),
            grad_norm=grad_norm,
            num_tokens=int(num_tokens),
            metrics=metrics,
            step=self._version,
            num_fed_tokens=int(batch.attention_mask.sum()),
        )

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from emulated_model.version_weights(self._version)

    def save_checkpoint(self, path: str, with_optimizer: bool = True) -> None:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        (out / emulated_model.CHECKPOINT_FILE).write_text(json.dumps({"version": self._version}))
        config = self.model_dir / "config.json"
        if config.is_file() and config.resolve() != (out / "config.json").resolve():
            shutil.copyfile(config, out / "config.json")

    def load_checkpoint(self, path: str, with_optimizer: bool = True) -> None:
        self._version = int(json.loads((Path(path) / emulated_model.CHECKPOINT_FILE).read_text())["version"])

    @property
    def version(self) -> int:
        return self._version
