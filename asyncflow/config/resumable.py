"""Which config keys ``afctl up --resume RUN_DIR --set KEY=VALUE`` may change.

A resumed run continues from a checkpoint made with the saved config: the model's
weights and optimizer state, the queue's rows and the loader's place in its prompt
order. A key may change on resume only when none of these depends on it; every other
key is refused by name, with the reason. The allow-list is deliberately small:

- ``train.num_steps``: extend a finished run (or shorten one). With
  ``lr_schedule = "cosine"`` the lr is a function of (step, num_steps), so the curve
  is recomputed over the new total from the resumed step on: it jumps back up from
  where the old schedule had brought it (docs/faults.md, "Extending a run").
- ``train.checkpoint_every``, ``train.keep_checkpoints``, ``train.dist_timeout_s``, ``logging.*``,
  ``workflow.weight_timeout_s``, ``cluster.max_resumes``,
  ``cluster.threads_per_process``, ``cluster.pin_trainer_cores``,
  ``cluster.transport.ask_timeout_s``, ``cluster.transport.freeze_timeout_s``: how
  often, how long, what is written, where processes run.
- ``rollout.gateway.*``: the HTTP gateway (docs/gateway.md); with ``train`` its sessions
  come back from its journal, whatever these keys (docs/gateway.md, "Across a resume").
- ``eval.every_steps``: between two non-zero values only (turning evaluation on or
  off changes which prompts the loader trains on, and the loader resumes at a place
  in that order).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from asyncflow.config.load import ConfigError, _format_error, apply_overrides
from asyncflow.config.run import RunConfig, check_paths, validate

RESUMABLE_KEYS = (
    "train.num_steps",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.dist_timeout_s",
    "eval.every_steps",
    "workflow.weight_timeout_s",
    "workflow.prefetch_batch",
    "cluster.max_resumes",
    "cluster.threads_per_process",
    "cluster.pin_trainer_cores",
    "cluster.transport.ask_timeout_s",
    "cluster.transport.freeze_timeout_s",
    "logging.*",
    "rollout.gateway.*",
)
"""Keys (``section.*``: every key of the section) that may change on resume."""

_WHY = {
    "model": "the checkpoint holds the weights trained from this model",
    "data": "the loader resumes at its place in this data's prompt order",
    "algorithm": "the trained steps and the queued rows were made under this algorithm",
    "train": "the optimizer state and the queued rows were made for this trainer",
    "critic": "the checkpoint holds this critic's state",
    "rollout": "the queued rows were generated with these settings",
    "reference": "the queued rows carry this reference's log-probabilities",
    "reward": "the queued rows were scored this way",
    "queue": "the queue is restored from the checkpoint with this layout",
    "workflow": "the queued rows were admitted under this mode and staleness",
    "cluster": "the run's processes and their addresses are laid out from it",
    "planner": "the planner's moves are part of the run's layout",
    "eval": "the held-out split is fixed for the whole run",
    "roles": "custom roles' tasks are restored with the queue",
    "seed": "the run's random streams continue from the checkpoint",
}


def resumable(key: str) -> bool:
    return any(key == k or (k.endswith(".*") and key.startswith(k[:-1])) for k in RESUMABLE_KEYS)


def apply_resume_overrides(cfg: RunConfig, overrides: Sequence[str]) -> RunConfig:
    """``cfg`` (a run's saved config) with ``KEY=VALUE`` items applied; a key that
    cannot change on resume raises ConfigError naming it, the reason and the keys
    that can."""
    if not overrides:
        return cfg
    for item in overrides:
        key = item.partition("=")[0].strip()
        if not resumable(key):
            section = "cluster" if key.endswith(".devices") else key.split(".")[0]  # a role's devices: where it runs
            why = _WHY.get(section, "it is not a key that can change on resume")
            raise ConfigError(
                f"--set {key}: cannot change when resuming ({why}). Keys that can: {', '.join(RESUMABLE_KEYS)}; "
                f"to change {key}, start a new run: afctl up CONFIG --set {key}=..."
            )
    raw = apply_overrides(msgspec.to_builtins(cfg), overrides)
    try:
        new = msgspec.convert(raw, RunConfig)
    except msgspec.ValidationError as exc:
        raise _format_error(exc, "--set") from None
    if bool(new.eval.every_steps) != bool(cfg.eval.every_steps):
        raise ConfigError(
            f"--set eval.every_steps={new.eval.every_steps}: cannot turn evaluation "
            f"{'on' if new.eval.every_steps else 'off'} when resuming (the held-out split decides which prompts "
            f"the loader trains on, and the loader resumes at its place in that order); change it between "
            f"non-zero values only, or start a new run"
        )
    validate(new)
    check_paths(new)
    return new
