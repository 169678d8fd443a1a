"""EvaluatorActor: held-out evaluation in a process of its own (``eval.where``), so that
the trainer goes on training while a version is evaluated.

The trainer tells ``Evaluate(step, version)`` after publishing ``version`` (and, with
``eval.at_start``, ``Evaluate(start=True)`` for the weights the run starts from, before
its first step). One ``work_once`` takes the oldest request:

1. the weights: the start weights are the model directory's, which the engine is built
   with; any other version is fetched from the trainer's ``weights`` actor over nng (the
   newest it stages, once that is ``version`` or newer: the trainer tells before its
   publish is staged);
2. ``Evaluator.run_one`` evaluates them on the held-out prompts, appends eval.jsonl and
   eval_samples.jsonl, and saves ``checkpoints/best`` when ``val/accuracy`` beats every
   earlier one;
3. ``Evaluated`` goes back to the trainer, which puts the figures in the next step's
   metrics record (``val/version`` says which version they are of).

The evaluator runs at a lower CPU priority (``EVAL_NICE``): it yields the cores to the
trainer and the replicas. The run's last evaluation (``last``) is the one the trainer waits for: training is over,
so the evaluator takes the trainer's threads for it (``train.engine.num_threads``, else
every core) and ends once it is sent. An evaluation that fails is logged and answered
with its error (the trainer logs it and goes on without those figures): evaluation
never stops a run.

Takes: LoopActor messages + Evaluate (urgent: queued at once, even mid-evaluation).
Sends: Evaluated (to the trainer), GetLatestWeights and GetWeightChunk (to ``weights``).
"""

from __future__ import annotations

import logging
import os
import queue
import time
import traceback

import msgspec

from asyncflow.actors.evaluation.evaluator import Evaluator
from asyncflow.actors.runtime import messages
from asyncflow.actors.runtime import spec as roles
from asyncflow.actors.runtime.loop import LoopActor
from asyncflow.actors.runtime.run_dir import Run, set_threads
from asyncflow.actors.weights import build_receiver
from asyncflow.config import names
from asyncflow.core import protocol
from asyncflow.planner import memory

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5
"""How long one idle ``work_once`` waits for a request: Pause and Stop are handled
between two waits."""
EVAL_NICE = 10
"""The evaluator's CPU priority, lowered by this much (``os.nice``): where it shares cores
with the trainer and the replicas, it takes the cycles they leave rather than slowing the
step (SmolLM2 on 2 cores: 204 s against 210 s a run, ``scripts/eval_placement.py``). The
run's last evaluation, which the trainer waits for, has the cores to itself anyway."""
STAGED_POLL_S = 0.05
"""How often the evaluator asks ``weights`` again while the version it was asked for is
not staged yet (the trainer tells right after handing it over)."""


class EvaluatorActor(LoopActor):
    Inbox = messages.EvaluatorIn
    Urgent = LoopActor.Urgent + (messages.Evaluate,)

    def __init__(self, ctx, run_dir: str):
        super().__init__(ctx)
        import torch

        self.run = Run(run_dir)
        cfg = self.run.config
        set_threads(cfg)
        os.nice(EVAL_NICE)
        self._last_threads = cfg.train.engine.num_threads or os.cpu_count() or 1
        self._torch = torch
        self.evaluator = Evaluator(self.run, device=cfg.rollout.engine.device)
        self.receiver = build_receiver("nng", ctx, cfg.workflow.weight_timeout_s)
        self._requests: queue.Queue[messages.Evaluate] = queue.Queue()
        self._version = self.run.launch.start_step  # the newest version evaluated
        self._done = False

    @property
    def version(self) -> int:
        return self._version

    def handle_urgent(self, msg):
        if isinstance(msg, messages.Evaluate):
            self._requests.put(msg)
            return protocol.Ok()
        return super().handle_urgent(msg)

    def work_once(self) -> bool:
        if self._done:
            return False
        with self.activity("wait_request"):
            try:
                request = self._requests.get(timeout=IDLE_WAIT_S)
            except queue.Empty:
                return True
        with self.activity("eval"):
            reply = self._evaluate(request)
        self.ctx.ref(names.TRAINER, wait_s=5.0).tell(reply)
        self.num_items += 1
        self._done = request.last
        return not self._done

    def _evaluate(self, request: messages.Evaluate) -> messages.Evaluated:
        step, version = request.step, request.version
        if not request.start and version <= self._version:  # a newer one was evaluated already (it was asked for late)
            log.info("%s: version %d skipped: version %d is evaluated already", self.ctx.name, version, self._version)
            return messages.Evaluated(step=step, version=version)
        try:
            if request.last:  # training is over: its cores are free
                self._torch.set_num_threads(self._last_threads)
            if request.start:
                values = self.evaluator.run_one(0, None, 0, save=False)
            else:
                version, snapshot = self._fetch(version)
                step = version - 1
                values = self.evaluator.run_one(step, snapshot, version)
            self._version = version
            return messages.Evaluated(step=step, version=version, start=request.start, values=values)
        except Exception as exc:  # evaluation never stops the run: the trainer logs the error and goes on
            log.error("%s: evaluating version %d failed: %s", self.ctx.name, version, traceback.format_exc())
            return messages.Evaluated(step=step, version=version, start=request.start, error=f"{type(exc).__name__}: {exc}")

    def _fetch(self, version: int) -> tuple[int, list]:
        """Version ``version`` once ``weights`` stages it, or the newest it stages when it
        no longer holds ``version`` (it keeps the two newest)."""
        weights = self.ctx.ref(names.WEIGHTS, wait_s=5.0)
        deadline = time.monotonic() + self.run.config.workflow.weight_timeout_s
        while True:
            latest = weights.ask(messages.GetLatestWeights(), timeout_s=30)
            if latest.version >= version:
                # every version of a run is cut into the same chunks (same tensors, same chunk size): ask for
                # ``version``'s; the receiver takes the newest instead when it is no longer staged
                wanted = msgspec.structs.replace(latest, version=version, digest=0)
                return self.receiver.fetch(weights, announced=wanted)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"version {version} was not staged by the weights actor within workflow.weight_timeout_s "
                    f"({self.run.config.workflow.weight_timeout_s:g} s); the newest is {latest.version}"
                )
            time.sleep(STAGED_POLL_S)

    def on_stop(self) -> None:
        try:
            self.evaluator.close()
            self.receiver.close()
        except Exception:
            log.exception("%s: closing the evaluation engine failed", self.ctx.name)
        super().on_stop()


def evaluator_memory(cfg, facts: memory.MemoryFacts) -> float:
    """The evaluation engine's weights and KV cache (64 MiB unless
    ``rollout.engine.kv_cache_bytes``), and one fetched version beside them."""
    shape, b = facts.shape, memory.DTYPE_BYTES[cfg.rollout.engine.dtype]
    kv = cfg.rollout.engine.kv_cache_bytes or memory.DEFAULT_KV_BYTES
    return shape.num_params * b + kv + memory.synced_params(cfg, shape) * 4


ROLE = roles.RoleSpec(
    name=names.EVALUATOR,
    actor=EvaluatorActor,
    instances=lambda cfg: [names.EVALUATOR] if cfg.eval_in_process else [],
    restartable=True,  # it holds no rows: a restarted one answers the next request (the lost one is logged by the trainer)
    section="eval",
    devices_used=lambda cfg: [("rollout.engine.device", cfg.rollout.engine.device)],
    memory=evaluator_memory,
    working_memory=lambda cfg, facts: float(memory.PROCESS_BYTES),
)
