"""Checkpointer: a consistent checkpoint of the whole run, taken by the trainer at a step
boundary (every ``train.checkpoint_every`` steps and at the end).

1. settle the trainer's own work: the publish in flight staged, every trained row
   acked, every step's metrics delivered (metrics.jsonl holds every step it covers);
2. pause every other role (``_pause.py``: each answers between units, its rows acked;
   a role restarted meanwhile is asked at its new address); the rollout replicas are
   the driver's roster's current ones (the online planner may have moved some);
3. save into ``step_N.tmp``: the queue, the model and optimizer (every trainer rank
   joins the gather), the roles' states, the manifest (``manifest.py``), ``DONE``;
   rename it ``step_N``; resume the roles, whatever happened;
4. point ``checkpoints/latest`` at it, then delete the ones beyond
   ``train.keep_checkpoints`` (the roles already work again).

Sends: GetReplicas (the roster), Pause and Resume (every other role); TQ save.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from asyncflow.actors.runtime import messages
from asyncflow.actors.trainer._pause import pause_roles
from asyncflow.actors.trainer.checkpoints import checkpoint_dir, link_latest, prune_checkpoints
from asyncflow.actors.trainer.manifest import write_manifest
from asyncflow.config import names
from asyncflow.core.disk_space import DiskFull, no_space_left
from asyncflow.core.errors import ActorGone, ActorTimeout, AsyncflowError

if TYPE_CHECKING:
    from asyncflow.actors.runtime.run_dir import Run
    from asyncflow.actors.trainer.policy import PolicyUpdate
    from asyncflow.actors.trainer.rank import RankGroup
    from asyncflow.core.ref import ActorRef
    from asyncflow.core.tq.client import TQClient

log = logging.getLogger(__name__)

PAUSE_DEADLINE_S = 600.0
"""How long a checkpoint waits for one role to pause (it answers between units of work)."""
PAUSE_THREADS = 32
"""Roles a checkpoint asks to pause at once (a killed host of packed replicas restarts them together)."""


class Checkpointer:
    def __init__(
        self,
        run: Run,
        tq: TQClient,
        policy: PolicyUpdate,
        ranks: RankGroup,
        other_roles: list[str],
        rollout_replicas: list[str],
        fresh_ref: Callable[[str], ActorRef],
        settle: Callable[[], None],
    ):
        """``other_roles``: every role to pause but the trainer's ranks (the replicas at
        start among them); ``fresh_ref``: the newest process registered under a name;
        ``settle``: the trainer's own work made final (step 1 above)."""
        self.run, self.tq, self.policy, self.ranks = run, tq, policy, ranks
        self.other_roles = other_roles
        self._initial_replicas = set(rollout_replicas)
        self._fresh_ref = fresh_ref
        self._settle = settle
        self._pool: ThreadPoolExecutor | None = None  # made at the first checkpoint, kept for its nng contexts

    def due(self, step: int) -> bool:
        """Whether the schedule checkpoints after ``step`` steps (the last one always does, at the run's end)."""
        cfg = self.run.config
        every = cfg.train.checkpoint_every
        return bool(every) and step % every == 0 and step < cfg.train.num_steps

    def save(self, step: int) -> Path:
        """The checkpoint of the run after ``step`` steps: ``checkpoints/step_<step>``."""
        self._settle()
        final = checkpoint_dir(self.run.dir, step)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        paused: list = []  # the references that answered Pause: a role restarted meanwhile is asked at its new address
        try:
            states = self._pause_roles(step, paused)
            try:
                self._write(step, tmp, states)
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
                aside = link_latest(final)
            except (OSError, RuntimeError) as exc:  # torch's writer says "unexpected pos" for a full disk
                full = no_space_left(exc, tmp)
                if full is None:
                    raise
                raise DiskFull(
                    f"{full}: the checkpoint after step {step} could not be saved. Free space there (fewer "
                    f"checkpoints kept: train.keep_checkpoints; or a run directory on a larger disk), then resume"
                ) from exc
            if aside is not None:
                log.warning("checkpoints/latest was a directory, not a link: moved to %s", aside)
        finally:
            self._resume_roles(step, paused)
        keep = self.run.config.train.keep_checkpoints  # deleted once the roles work again: not in their pause
        try:
            for old in prune_checkpoints(self.run.dir, keep):
                log.info("deleted checkpoint %s (train.keep_checkpoints = %d)", old.name, keep)
        except OSError as exc:  # the new checkpoint stands; an old one left behind is no reason to stop
            log.warning("could not delete an old checkpoint (train.keep_checkpoints = %d): %s", keep, exc)
        log.info("checkpoint at step %d: %s", step, final)
        return final

    def _pause_roles(self, step: int, paused: list) -> dict[str, bytes]:
        """Pause every other role (each answers between units, its rows acked), appending
        each reference that answered to ``paused``; returns their resumable states."""
        try:
            replicas = self._fresh_ref(names.ROSTER).ask(messages.GetReplicas(), timeout_s=10).names
        except (AsyncflowError, LookupError) as exc:  # the driver frozen or gone: the replicas at start
            log.warning("checkpoint at step %d: the roster did not answer (%s); pausing the replicas at start", step, exc)
            replicas = sorted(self._initial_replicas)
        others = [n for n in self.other_roles if n not in self._initial_replicas] + list(replicas)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=PAUSE_THREADS, thread_name_prefix="pause")
        return pause_roles(self._fresh_ref, others, paused, self._pool, deadline_s=PAUSE_DEADLINE_S)

    def _write(self, step: int, tmp: Path, states: dict[str, bytes]) -> None:
        """The queue, the model and optimizer (every rank joins), the roles' states, the manifest."""
        self.tq.save(str(tmp / "queue"))
        self.ranks.save_checkpoint(str(tmp))  # the save gathers the shards of every rank
        self.policy.save(tmp)
        (tmp / "roles.msgpack").write_bytes(msgspec.msgpack.encode(states))
        write_manifest(tmp)  # checked on resume: a damaged checkpoint is named and skipped
        (tmp / "DONE").write_text(f"{step}\n")

    def _resume_roles(self, step: int, paused: list) -> None:
        for ref in paused:
            try:
                ref.tell(messages.Resume())
            except (ActorGone, ActorTimeout) as exc:  # it died since its Pause: restarted, it starts unpaused
                log.warning("checkpoint at step %d: %s not resumed, its process is gone (%s)", step, ref.name, exc)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
