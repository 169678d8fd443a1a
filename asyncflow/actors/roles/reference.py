"""ReferenceActor: log-probs of responses under the frozen reference policy (for KL).

Each unit: take rows of the ``reference`` task with ``prompt_ids`` and
``response_ids``, compute per-token log-probs of the response under the base model
(no gradients), put ``ref_logp`` (float32 [L]) per row, ack (with the next request). Started only when
``algorithm.kl_coef > 0`` or an estimator that needs one (``algorithm.needs_reference``).

Takes: LoopActor messages. Sends: TQ reads and writes.
"""

from __future__ import annotations

import msgspec
import numpy as np

from asyncflow.actors.runtime import spec as roles
from asyncflow.actors.runtime.acks import DeferredAcks
from asyncflow.actors.runtime.batching import token_batch
from asyncflow.actors.runtime.loop import LoopActor
from asyncflow.actors.runtime.run_dir import Run, set_threads
from asyncflow.config import names
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.errors import BatchTimeout
from asyncflow.planner import memory


class ReferenceActor(LoopActor):
    acks: DeferredAcks  # made in __init__ (the base class allows None)
    COLUMNS = ["prompt_ids", "response_ids"]

    def __init__(self, ctx, run_dir: str):
        super().__init__(ctx)
        from asyncflow.engines.config import LoraConfig
        from asyncflow.engines.factory import build_train_engine

        self.run = Run(run_dir)
        cfg = self.run.config
        set_threads(cfg)
        # the trainer's engine settings, in one process: a reference worker is not a trainer rank; the base
        # model it scores with has no adapters (with LoRA, the policy is the base plus its adapters)
        engine_cfg = msgspec.structs.replace(cfg.train.engine, fsdp=False, lora=LoraConfig())
        self.engine = build_train_engine(engine_cfg, self.run.launch.base_model_dir)
        self.temperature = cfg.rollout.sampling.temperature or 1.0
        # the same truncation as the policy's log-probs: the KL compares the two truncated distributions
        self.top_k, self.top_p = cfg.rollout.sampling.top_k, cfg.rollout.sampling.top_p
        self.sync = cfg.workflow.mode == "sync"
        self.tq = TQClient(ctx.directory, consumer=ctx.name)
        self.acks = DeferredAcks(self.tq)

    def work_once(self) -> bool:
        cfg = self.run.config
        size = cfg.rows_per_step if self.sync else cfg.reference.micro_batch_size
        with self.activity("wait_data"):
            try:
                batch = self.tq.get_batch(
                    names.TASK_REFERENCE,
                    self.COLUMNS,
                    size,
                    partial=not self.sync,
                    timeout_s=0.5,
                    policy="group" if self.sync else "fifo",
                    ack=self.acks.take(names.TASK_REFERENCE),
                )
                if len(batch) == 0:
                    batch = self.tq.get_batch(names.TASK_REFERENCE, self.COLUMNS, 1, timeout_s=0.5)
            except BatchTimeout:
                return True
        with self.activity("forward"):
            tb, starts = token_batch(batch.columns["prompt_ids"], batch.columns["response_ids"])
            logp_BT = self.engine.forward(tb, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p).logp
            out = [
                logp_BT[b, s : s + len(r)].numpy().astype(np.float32)
                for b, (s, r) in enumerate(zip(starts, batch.columns["response_ids"]))
            ]
        with self.activity("put"):
            self.tq.put(batch.indices, {"ref_logp": out})
        self.acks.add(batch)  # acked inside the next request
        self.num_items += len(batch)
        return True


# -- the role, as the driver sees it (actors/driver/topology.py) ---------------------------------

ROLE = roles.RoleSpec(
    name=names.REFERENCE,
    actor=ReferenceActor,
    instances=roles.numbered(names.REFERENCE, lambda cfg: cfg.reference.num_workers if cfg.algorithm.needs_reference else 0),
    task=names.TASK_REFERENCE,
    outputs=("ref_logp",),
    restartable=True,
    device=roles.Devices.ONE,
    devices_used=lambda cfg: [("train.engine.device", cfg.train.engine.device)],  # the trainer's engine settings
    memory=lambda cfg, facts: facts.shape.num_params * memory.DTYPE_BYTES[cfg.train.engine.dtype],  # the base weights
    step_work=lambda cfg, cores: roles.StepWork(
        what="reference forward",
        flops_per_param_token=2,
        units=roles.compute_units(cfg, cores, cfg.reference.num_workers),
        efficiency="forward",
    ),
)
