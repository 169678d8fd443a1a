"""StepEnd: what follows a trained step s, whatever its shape.

1. each row's staleness by its oldest token (partial rollout), before publishing;
2. publish version s + 1: export the weights, record their digest (version integrity,
   ``_versions.py``), hand them to the ``weights`` actor, which stages them and tells
   the replicas in its own thread (the previous publish is waited for first: versions
   are staged in order, one at a time);
3. log a few rows as text every ``logging.samples_every`` steps (``_samples.py``);
4. defer the acks of the step's rows (trained and dropped) to the next request;
5. audit: the step's line of RUN_DIR/trained.jsonl, the exactly-once record;
6. report StepMetrics from a sender thread (the step never waits on the driver's
   receipt), with ``val/*`` when evaluation is due (``eval.every_steps``): the snapshot
   just published is evaluated in this process (a new best ``val/accuracy`` is saved as
   ``checkpoints/best``), or the ``evaluator`` process is asked to evaluate it
   (``eval.where``), and the figures of its answers so far go into this step's record
   (``_evals.py``; the run's last step waits for them).

It also owns what those steps keep across the run: the version ledger (whose digest
check the step sources run on the rows they take), the publish in flight, the totals,
the evaluator (or the evaluator process's answers).
"""

from __future__ import annotations

import logging
import time
from typing import IO, TYPE_CHECKING

import msgspec
import numpy as np

from asyncflow.actors.runtime import messages
from asyncflow.actors.trainer._evals import RemoteEvals
from asyncflow.actors.trainer._samples import SampleLog
from asyncflow.actors.trainer._versions import VersionLedger, token_staleness
from asyncflow.actors.trainer.sources.base import Batch, Trained
from asyncflow.actors.weights.actor import Publish
from asyncflow.config.names import COLLECTOR, TASK_TRAIN
from asyncflow.core import protocol
from asyncflow.core.phases import phase
from asyncflow.engines.device import torch_dtype

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    from asyncflow.actors.evaluation.evaluator import Evaluator
    from asyncflow.actors.runtime.acks import DeferredAcks
    from asyncflow.actors.runtime.run_dir import Run
    from asyncflow.actors.trainer.policy import PolicyUpdate
    from asyncflow.core.tq.notify import Notifier

log = logging.getLogger(__name__)


class StepEnd:
    def __init__(
        self,
        run: Run,
        policy: PolicyUpdate,
        acks: DeferredAcks,
        weights,
        reports: Notifier,
        activity: Callable[[str], AbstractContextManager],
        num_ranks: int,
        start_step: int,
        tell: Callable[[str, object], None] | None = None,
    ):
        """``weights``: the in-process reference of this process's ``weights`` actor;
        ``reports``: the sender of StepMetrics to the collector; ``tell(name, message)``:
        a tell to another actor (the evaluator)."""
        cfg = run.config
        self.run, self.policy, self.acks = run, policy, acks
        self._weights, self._reports, self._activity = weights, reports, activity
        self.num_ranks = num_ranks
        self._publishing = None  # the future of the last publish (weights stage it in their thread)
        self._started = time.monotonic()
        self._num_samples = 0
        self._num_tokens = 0
        self._audit_file: IO[str] | None = None  # RUN_DIR/trained.jsonl, open for appending after the first step
        self._verify = cfg.workflow.verify_weights
        self._rollout_dtype = torch_dtype(cfg.rollout.engine.dtype)
        self._versions = VersionLedger()  # version -> weights digest, of the versions rows may still carry
        if self._verify != "off" and num_ranks == 1:  # with ranks the export is a collective: start rows go unverified
            digest = policy.engine.published_digest(policy.export_weights(), self._rollout_dtype)
            self._versions.record(start_step, digest)
        self.samples = SampleLog(run.dir, run.hf_tokenizer, cfg.logging.samples_every, cfg.logging.samples_per_step)
        self._evaluator: Evaluator | None = None  # with eval.every_steps, evaluating in this process
        self._remote: RemoteEvals | None = None  # with eval.every_steps, evaluating in the evaluator's
        if cfg.eval.every_steps and cfg.eval_in_process:
            assert tell is not None, "evaluations in the evaluator's process need tell"
            self._remote = RemoteEvals(tell)
        elif cfg.eval.every_steps:
            from asyncflow.actors.evaluation.evaluator import Evaluator

            self._evaluator = Evaluator(run)
        # eval.at_start: the starting weights, evaluated by the first step's report (step 0 of a new run)
        self._start_snapshot = None
        if cfg.eval.at_start and start_step == 0:  # one rank: the config refuses at_start with train.num_ranks > 1
            if self._remote is not None:  # the evaluator's engine is built with them: it starts now, beside the first rollouts
                self._remote.ask(messages.Evaluate(step=0, version=0, start=True))
            else:
                self._start_snapshot = [(n, t.detach().clone()) for n, t in policy.export_weights()]

    def check_versions(self, meta: protocol.BatchMeta, step: int) -> dict[str, float]:
        """Each row's weights digest against the digest of the version it is tagged with."""
        if self._verify == "off":
            return {}
        return self._versions.check(step, meta.indices, meta.metas, strict=self._verify == "error")

    def finish(self, step: int, batch: Batch, trained: Trained) -> None:
        """Everything after training step ``step`` (the module's docstring, 1 to 6)."""
        cfg = self.run.config
        meta, columns, integrity = batch.meta, trained.columns, dict(batch.integrity)
        if "token_versions" in columns:  # partial rollout: each row's staleness is its oldest token's (before publishing)
            mine = trained.parts[0]
            indices, metas = [meta.indices[p] for p in mine], [meta.metas[p] for p in mine]
            integrity.update(token_staleness(step, cfg.staleness, indices, metas, columns["token_versions"]))
        version = step + 1
        snapshot, weight_bytes = self._publish_weights(version)
        if self.samples.due(step):  # what the model writes, as text (RUN_DIR/samples.jsonl)
            self.samples.write(step, columns, [meta.metas[p].version for p in trained.parts[0]])
        # the rows are acked (and freed) inside the next step's request, or by the checkpoint's flush
        self.acks.add_rows(TASK_TRAIN, meta.indices)
        if batch.dropped:
            self.acks.add_rows(TASK_TRAIN, batch.dropped)  # taken, not trained: acked like trained rows, audited below
        with self._activity("audit"):
            self._audit(step, batch, trained.parts)
        values = dict(trained.values)
        values.update(batch.figures)
        self._report(step, batch, trained, values, integrity, snapshot, version, weight_bytes)

    def _publish_weights(self, version: int) -> tuple[list, int]:
        """Export the trained weights, record their digest, hand them to ``weights``;
        returns the snapshot and its size in bytes."""
        with self._activity("sync_weights"):
            with phase("export"):
                snapshot = self.policy.export_weights()
            digest = 0
            if self._verify != "off":
                with phase("digest"):
                    digest = self.policy.engine.published_digest(snapshot, self._rollout_dtype)
                self._versions.record(version, digest)
                self._versions.forget_before(version - self.run.config.staleness - 1)
            with phase("publish"):
                self.published()
                self._publishing = self._weights.ask(Publish(version, snapshot, digest), block=False)
        return snapshot, sum(t.numel() * t.element_size() for _, t in snapshot)

    def published(self) -> None:
        """Wait for the publish in flight, if any (re-raising its error: it fails this step)."""
        pending, self._publishing = self._publishing, None
        if pending is not None:
            pending.get(timeout=600)

    def deliver_reports(self, timeout_s: float = 30.0) -> None:
        """Wait until every step's metrics reported so far reached the collector (before a
        checkpoint, the run's end, a stop): metrics.jsonl then holds every step up to here."""
        try:
            self._reports.flush(timeout_s)
        except TimeoutError as exc:
            log.warning("%s", exc)

    def _report(self, step, batch: Batch, trained: Trained, values, integrity, snapshot, version, weight_bytes) -> None:
        """The step's metrics (with val/* when evaluation is due) to the collector."""
        cfg = self.run.config
        meta, figures = batch.meta, trained.figures
        staleness = [step - m.version for m in meta.metas]
        self._num_samples += len(meta.indices)
        self._num_tokens += int(figures["tokens"])
        values.update(
            step=step,
            version=version,
            reward_mean=figures["reward_mean"],
            reward_max=figures["reward_max"],
            samples=len(meta.indices),
            tokens=figures["tokens"],
            response_tokens=figures["response_tokens"],
            response_len_mean=figures["response_tokens"] / len(meta.indices),
            truncated_frac=figures["truncated_frac"],
            overlong_penalty_mean=figures["overlong_penalty_mean"],
            truncated_masked_frac=figures["truncated_masked_frac"],
            total_samples=self._num_samples,
            total_tokens=self._num_tokens,
            time_s=time.monotonic() - self._started,
            step_time_s=time.monotonic() - batch.started,
            staleness_max=max(staleness),
            staleness_mean=float(np.mean(staleness)),
            weight_bytes=weight_bytes,
            batch_prefetched=float(batch.prefetched),
            num_ranks=self.num_ranks,
            **integrity,
            **score_means(trained.columns, self.policy.extra_rewards),
            **{k: v for k, v in figures.items() if k.startswith("env/")},  # with an environment (docs/environments.md)
        )
        eval_every = cfg.eval.every_steps
        due = bool(eval_every) and (version % eval_every == 0 or version == cfg.train.num_steps)
        if self._remote is not None:
            if due:
                last = version == cfg.train.num_steps
                self._remote.ask(messages.Evaluate(step=step, version=version, last=last))
                if last:  # the run's last figures go into its last record
                    with self._activity("wait_eval"):
                        self._remote.wait()
            values.update(self._remote.figures())
        else:
            if self._start_snapshot is not None:  # eval.at_start, the first step of a new run
                start = self._evaluate(0, self._start_snapshot, 0, save=False)  # the weights the run started from
                self._start_snapshot = None
                values.update({"val/start_accuracy": start["val/accuracy"], "val/start_reward_mean": start["val/reward_mean"]})
            if due:
                values.update(self._evaluate(step, snapshot, version))
        self._reports.tell(COLLECTOR, messages.StepMetrics(step=step, values={k: float(v) for k, v in values.items()}))

    def evaluated(self, answer: messages.Evaluated) -> None:
        """The evaluator's answer (the trainer's listener thread): into the next report."""
        if self._remote is not None:
            self._remote.evaluated(answer)

    def _evaluate(self, step: int, snapshot, version: int, save: bool = True) -> dict[str, float]:
        """``val/*`` of version ``version`` (``snapshot``), evaluated in this process."""
        with self._activity("eval"):
            assert self._evaluator is not None  # the step evaluates only with eval.every_steps, which made it
            return self._evaluator.run_one(step, snapshot, version, save=save)

    def _audit(self, step: int, batch: Batch, parts: list[list[int]]) -> None:
        """RUN_DIR/trained.jsonl: which rows (and prompt groups) each step trained on,
        with their policy versions and the trainer rank that trained each: the
        exactly-once record a user (or a test) checks. The step source adds its own
        fields: dynamic sampling the step's dropped rows and groups (equal rewards:
        ``filtered_groups``; beyond the batch: ``surplus_groups``) and the groups of
        equal rewards trained to give every rank a group (``padded_groups``); gateway
        sessions the ones discarded as too old (``stale_sessions``)."""
        meta = batch.meta
        rank_of = [0] * len(meta.indices)
        for rank, positions in enumerate(parts):
            for p in positions:
                rank_of[p] = rank
        line: dict[str, object] = {
            "step": step,
            "indices": list(meta.indices),
            "groups": [m.group_id for m in meta.metas],
            "versions": [m.version for m in meta.metas],
            "ranks": rank_of,
            **batch.audit,
        }
        if self._audit_file is None:
            self._audit_file = (self.run.dir / "trained.jsonl").open("a")
        self._audit_file.write(msgspec.json.encode(line).decode() + "\n")
        self._audit_file.flush()  # each step's line is in the file when the step is reported

    def close(self) -> None:
        if self._audit_file is not None:
            self._audit_file.close()
        if self._evaluator is not None:
            self._evaluator.close()


def score_means(columns: dict[str, list], extra_rewards: list[tuple[str, float]]) -> dict[str, float]:
    """``score/<column>``: the mean of each custom role's ``reward_column`` over the rows
    this trainer process read (all of the step's rows with one rank; rank 0's share
    with several), before ``reward_weight``."""
    return {
        f"score/{column}": float(np.mean([float(v[0]) for v in columns[column]])) if columns[column] else 0.0
        for column, _ in extra_rewards
    }
