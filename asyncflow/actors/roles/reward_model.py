"""RewardModelActor: scores responses with a model, served as its own role
(``[reward_model]``, docs/reward-models.md).

Each unit: take up to ``reward_model.batch_size`` rows of the ``reward_model`` task
whose ``prompt_ids``, ``response_ids`` and ``answer`` are produced, decode them with
the policy's tokenizer, score them with the configured ``RewardScorer`` (a sequence
classifier's head, or a judge's parsed verdict) and put ``rm_score`` (float32 [1])
per row; the rows are acked with the next request (``runtime/acks.py``, via ``ColumnRole``).
The trainer waits for ``rm_score`` and adds ``reward_model.weight`` times it to the
reward functions' ``reward`` (``trainer/policy.PolicyUpdate.rewards``).

Takes: LoopActor messages. Sends: TQ reads and writes.
Invariant: every row gets exactly one score. The role has its own queue task, so a
row is handed to one replica once; a dead replica's un-acked rows are requeued to
the task, and rows it had already put ``rm_score`` for are acked, not scored again
(``RoleSpec.outputs``).
"""

from __future__ import annotations

import numpy as np

from asyncflow.actors.roles.column_role import ColumnRole
from asyncflow.actors.runtime import spec as roles
from asyncflow.actors.runtime.run_dir import set_threads
from asyncflow.config import names
from asyncflow.config.roles import REWARD_MODEL_COLUMN
from asyncflow.core import protocol
from asyncflow.core.phases import phase
from asyncflow.planner import memory


class RewardModelActor(ColumnRole):
    inputs = ("prompt_ids", "response_ids", "answer")

    def __init__(self, ctx, run_dir: str):
        from asyncflow.engines.factory import build_reward_scorer

        super().__init__(ctx, run_dir, task=names.TASK_REWARD_MODEL, output=REWARD_MODEL_COLUMN)
        cfg = self.run.config
        set_threads(cfg)
        rm = cfg.reward_model
        self.batch_size = rm.batch_size
        self.tokenizer = self.run.hf_tokenizer()
        model_dir = self.run.launch.reward_model_dir or self.run.launch.base_model_dir
        self.scorer = build_reward_scorer(
            rm.kind,
            model_dir,
            device=rm.device,
            dtype=rm.dtype,
            batch_size=rm.batch_size,
            template=rm.template,
            max_new_tokens=rm.judge_max_new_tokens,
            default=rm.judge_default_score,
        )

    def score(self, columns: dict[str, list[np.ndarray]], metas: list[protocol.RowMeta]) -> list[float]:
        decode = lambda ids: self.tokenizer.decode(ids.tolist(), skip_special_tokens=True)  # noqa: E731
        with phase("detokenize"):
            prompts = [decode(a) for a in columns["prompt_ids"]]
            responses = [decode(a) for a in columns["response_ids"]]
            answers = [bytes(a).decode() for a in columns["answer"]]
        with phase("forward"):
            return self.scorer.score(prompts, responses, answers)


# -- the role, as the driver sees it (actors/driver/topology.py) ---------------------------------

ROLE = roles.RoleSpec(
    name=names.REWARD_MODEL,
    actor=RewardModelActor,
    instances=roles.numbered(names.REWARD_MODEL, lambda cfg: cfg.reward_model.num_replicas if cfg.reward_model.enabled else 0),
    task=names.TASK_REWARD_MODEL,
    outputs=(REWARD_MODEL_COLUMN,),
    restartable=True,
    device=roles.Devices.ONE,
    devices_used=lambda cfg: [("reward_model.device", cfg.reward_model.device)],
    # its weights (a judge's: the policy's without a path), and a judge's KV budget (the native engine's default)
    memory=lambda cfg, facts: (
        facts.reward_model_params * memory.DTYPE_BYTES[cfg.reward_model.dtype]
        + (memory.DEFAULT_KV_BYTES if cfg.reward_model.kind == "judge" else 0)
    ),
)
