"""The policy update of one trainer rank, shared by rank 0 (TrainerActor) and the
other ranks (TrainerRankActor): engines, loss, advantages, and the step's figures.

With ``train.num_ranks = N > 1`` every rank holds an FSDP2 shard of the policy (and
of the PPO critic) in one torch.distributed default group, and trains its own part
of the global batch: whole prompt groups, so GRPO advantages need no exchange.
Overlong shaping (``algorithm.overlong_*``, ``mask_truncated``;
``algorithms/overlong.py``) is per row, so it needs none either: the length penalty
joins each row's reward before the group advantages, and a truncated row dropped
from the loss leaves the mask the engine takes the step's (all-reduced) loss
denominators from.
Everything below that touches the engine is a collective: every rank calls it in
the same order with the same number of micro-batches (the engine checks).

Shape legend: B rows of this rank, T tokens.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np
import torch

from asyncflow.actors.runtime.batching import fit_to_budget, token_batch
from asyncflow.actors.runtime.run_dir import Run, context_tokens
from asyncflow.actors.runtime.scoring import env_sums
from asyncflow.algorithms import registry
from asyncflow.algorithms.decoupled import STALENESS
from asyncflow.algorithms.off_policy import ratio_quantiles
from asyncflow.config.names import TRAINER
from asyncflow.core.phases import phase
from asyncflow.engines.base import LossContext, TokenBatch

log = logging.getLogger(__name__)

KL_CTRL_FILE = "kl_ctrl.json"
"""The adaptive KL coefficient in a checkpoint directory (``algorithm.kl_ctrl``)."""


def join_trainer_group(ctx, run: Run, rank: int):
    """Rendezvous of the trainer ranks (no-op for one rank) in their torch.distributed
    group, named after the role (published in the directory as ``dist.trainer``);
    returns the store to keep alive."""
    cfg = run.config
    if cfg.train.num_ranks == 1:
        return None
    from asyncflow.core.rendezvous import init_default_group
    from asyncflow.engines.device import dist_backend

    device = cfg.train.engine.device
    log.info("trainer rank %d/%d: joining group %r", rank, cfg.train.num_ranks, TRAINER)
    store = init_default_group(
        ctx.directory,
        TRAINER,
        ctx.transport,
        rank,
        cfg.train.num_ranks,
        dist_backend(device),
        cfg.train.dist_timeout_s,
        port=cfg.train.dist_port,
    )
    if device == "cuda" and torch.cuda.device_count() > 1:  # every device visible: one per rank
        torch.cuda.set_device(rank % torch.cuda.device_count())
    elif device == "npu" and torch.npu.device_count() > 1:  # type: ignore[attr-defined]
        torch.npu.set_device(rank % torch.npu.device_count())  # type: ignore[attr-defined]
    return store


class PolicyUpdate:
    """Engines and loss of one rank; ``train`` runs one optimizer step on this rank's rows."""

    def __init__(self, run: Run):
        from asyncflow.engines.factory import build_train_engine

        cfg, launch = run.config, run.launch
        self.cfg = cfg
        # the lr schedule runs over optimizer steps: one per epoch of each trainer step (the critic: one per step)
        self.engine = build_train_engine(
            cfg.train.engine, launch.model_dir, total_steps=cfg.train.num_steps * cfg.algorithm.epochs
        )
        self.estimator = cfg.algorithm.estimator  # the registry's entry: what it needs, its function
        self.estimate = registry.resolve(self.estimator.compute)
        if cfg.data_from_gateway:  # groups by key beside lone sessions (algorithms/session_baseline.py)
            from asyncflow.algorithms.session_baseline import session_advantages

            self.estimate = session_advantages
        self.critic = None
        if self.estimator.needs_critic:
            critic_dir = Path(launch.resume_from) / "critic" if launch.resume_from else Path(launch.model_dir)
            self.critic = build_train_engine(
                msgspec.structs.replace(cfg.critic.engine, critic=True), critic_dir, total_steps=cfg.train.num_steps
            )
        if launch.resume_from:
            self.engine.load_checkpoint(str(Path(launch.resume_from) / "model"), with_optimizer=True)
            if self.critic is not None:
                self.critic.load_checkpoint(str(Path(launch.resume_from) / "critic"), with_optimizer=True)
        alg = cfg.algorithm
        self.max_new_tokens = cfg.rollout.sampling.max_new_tokens
        self.log_ratios: list[torch.Tensor] = []  # per micro-batch, of the step's first pass
        self.loss_entry = registry.policy_loss(registry.loss_name(alg.loss))
        self.build_loss = registry.resolve(self.loss_entry.build)
        self.loss_fn = self.build_loss(alg, self.log_ratios, horizon=self.max_new_tokens)
        from asyncflow.algorithms.kl_control import controller
        from asyncflow.algorithms.loss_configs import FixedKL

        self.kl_ctrl = controller(alg.kl_ctrl, alg.kl_coef)
        self.kl_adaptive = alg.kl_ctrl != FixedKL()
        if launch.resume_from and (Path(launch.resume_from) / KL_CTRL_FILE).exists():
            self.kl_ctrl.value = float(json.loads((Path(launch.resume_from) / KL_CTRL_FILE).read_text())["kl_coef"])
        self.temperature = cfg.rollout.sampling.temperature or 1.0
        # the rollout's truncation: log-probs under the distribution its tokens were drawn from
        self.top_k, self.top_p = cfg.rollout.sampling.top_k, cfg.rollout.sampling.top_p
        self.columns = ["prompt_ids", "response_ids", "rollout_logp", "reward", "finish"]
        if alg.needs_reference:
            self.columns.append("ref_logp")
        self.multiturn = bool(cfg.env.path)  # rows carry loss_mask and the env_* columns (docs/environments.md)
        if self.multiturn:
            self.columns += ["loss_mask", "env_reward", "env_error", "env_tool_calls"]
        self.extra_rewards = cfg.reward_columns  # custom roles' columns, the reward model's rm_score
        self.columns += [column for column, _ in self.extra_rewards]
        if cfg.rollout_streams:  # each token's policy version (actors/rollout/stream.py)
            self.columns.append("token_versions")
        if cfg.data_from_gateway:  # sessions: their turns' mask and each token's version (gateway/feed.py)
            self.columns += [c for c in ("loss_mask", "token_versions") if c not in self.columns]
        self.distributed = cfg.train.num_ranks > 1
        self.budget = context_tokens(launch.model_dir)  # the longest row trained: the model's context
        self._parts: _Parts | None = None  # a step streamed in parts, between begin_parts and finish_parts

    def rewards(self, columns: dict[str, list]) -> torch.Tensor:
        """Reward of each row: the reward column plus the weighted scores of custom roles and of the reward model."""
        rewards_B = torch.tensor([float(r[0]) for r in columns["reward"]])
        for column, weight in self.extra_rewards:  # custom roles' scores (e.g. a judge), the reward model's
            rewards_B = rewards_B + weight * torch.tensor([float(v[0]) for v in columns[column]])
        return rewards_B

    @property
    def score_columns(self) -> list[str]:
        """The columns dynamic sampling's metric depends on (``filter_values``)."""
        return ["reward", "response_ids", "finish", *(column for column, _ in self.extra_rewards)]

    def filter_values(self, columns: dict[str, list]) -> torch.Tensor:
        """Each row's value of ``algorithm.dynamic_sampling_metric``: what must differ within a
        group for dynamic sampling to keep it."""
        metric = self.cfg.algorithm.dynamic_sampling_metric
        if metric == "reward":
            return self.shaped_rewards(columns)
        return torch.tensor([float(v[0]) for v in columns["reward" if metric == "score" else metric]])

    def shaped_rewards(self, columns: dict[str, list]) -> torch.Tensor:
        """Each row's reward as the group advantages see it (before ``kl_in_reward``'s
        KL term): the reward column, custom roles' weighted scores, the overlong penalty."""
        return self.rewards(columns) + self.overlong(columns)[0]

    def overlong(self, columns: dict[str, list]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each row's overlong penalty (<= 0, added to its reward; zeros without
        ``overlong_buffer``), whether it was truncated at ``max_new_tokens``, and
        whether it is dropped from the loss (truncated, with ``mask_truncated``)."""
        from asyncflow.algorithms.overlong import overlong_penalty, truncated_rows

        alg = self.cfg.algorithm
        lengths_B = torch.tensor([len(r) for r in columns["response_ids"]])
        penalty_B = overlong_penalty(lengths_B, self.max_new_tokens, alg.overlong_buffer, alg.overlong_penalty)
        truncated_B = truncated_rows(columns["finish"])
        drop_B = truncated_B.clone() if alg.mask_truncated else torch.zeros_like(truncated_B)
        return penalty_B, truncated_B, drop_B

    def train(
        self, columns: dict[str, list], group_ids: list[int], versions: list[int] | None = None, step: int = 0
    ) -> dict[str, float]:
        """One step ``step`` on this rank's rows (``columns[name][b]``, prompt group
        ``group_ids[b]``, generated by policy version ``versions[b]``)."""
        alg = self._step_algorithm()
        tb, rewards_B, drop_B = self.token_batch(columns, versions, step)
        out: dict[str, float] = {}
        if alg.kl_in_reward and alg.kl_coef > 0:
            kl_sum, kl_tokens = reward_kl_sums(tb, alg)
            out["kl"] = kl_sum / max(kl_tokens, 1.0)  # this rank's token mean
        out.update(self.advantages(tb, rewards_B, group_ids, drop_B, alg))
        out.update(self.update(tb))
        if self.kl_adaptive:
            out["kl_coef"] = self.kl_ctrl.value
            self.kl_ctrl.update(*self.batch_kl(tb, alg))
        return out

    def _step_algorithm(self):
        """``[algorithm]`` as this step's loss sees it: with the adaptive KL controller, its
        current coefficient (the loss is rebuilt with it)."""
        alg = self.cfg.algorithm
        if self.kl_adaptive:  # this step's coefficient: the loss and the estimator read it from [algorithm]
            alg = msgspec.structs.replace(alg, kl_coef=self.kl_ctrl.value)
            self.loss_fn = self.build_loss(alg, self.log_ratios, horizon=self.max_new_tokens)
        return alg

    def token_batch(
        self, columns: dict[str, list], versions: list[int] | None, step: int
    ) -> tuple[TokenBatch, torch.Tensor, torch.Tensor]:
        """The rows as a TokenBatch, each row's shaped reward, and the rows dropped from the loss."""
        columns, cut = fit_to_budget(columns, self.budget)
        if cut:
            log.warning(
                "step %d: %d row(s) longer than the model's context of %d tokens (max_position_embeddings) were cut to it "
                "and count as unfinished; their tokens past it are not trained. Bound them where they are made: "
                "env.max_context_tokens, rollout.sampling.max_new_tokens",
                step + 1, len(cut), self.budget,
            )  # fmt: skip
        per_token = {"rollout_logp": columns["rollout_logp"]}
        if "ref_logp" in columns:
            per_token["ref_logp"] = columns["ref_logp"]
        with phase("batch"):
            tb, _ = token_batch(columns["prompt_ids"], columns["response_ids"], per_token, columns.get("loss_mask"))
            penalty_B, _, drop_B = self.overlong(columns)
            rewards_B = self.rewards(columns) + penalty_B  # shaped before any advantage
            if self.loss_entry.needs_staleness:
                tb.extra[STALENESS] = staleness(tb, columns, versions, step)
        return tb, rewards_B, drop_B

    # -- one step streamed in parts (workflow.stream_step, one rank) ----------------------
    def begin_parts(self, rows: int) -> None:
        """Start a step whose ``rows`` come in parts of whole prompt groups, each trained
        (forward and backward) as it comes; ``finish_parts`` takes the optimizer step.
        The loss is normalised by a provisional context (``rows`` sequences of
        ``max_new_tokens``); ``finish_parts`` rescales the gradients to the step's real
        totals, so the update is the one ``train`` makes on all the rows at once."""
        self._step_algorithm()
        self.log_ratios.clear()
        self._parts = _Parts(LossContext(num_tokens=float(max(rows * self.max_new_tokens, 1)), num_seqs=float(max(rows, 1))))

    def train_part(self, columns: dict[str, list], group_ids: list[int], versions: list[int], step: int) -> None:
        """Forward and backward one part of the step (whole prompt groups: an estimator
        with ``group_local`` advantages gives them what the whole batch would)."""
        parts = self._parts
        if parts is None:
            raise RuntimeError("train_part before begin_parts")
        alg = self.cfg.algorithm
        tb, rewards_B, drop_B = self.token_batch(columns, versions, step)
        if alg.kl_in_reward and alg.kl_coef > 0:
            kl_sum, kl_tokens = reward_kl_sums(tb, alg)
            parts.kl_sum += kl_sum
            parts.kl_tokens += kl_tokens
        self.advantages(tb, rewards_B, group_ids, drop_B, alg)
        mask_BT = tb.response_mask.float()
        parts.num_tokens += float(mask_BT.sum())
        parts.num_seqs += float((mask_BT.sum(dim=1) > 0).sum())
        acc = self.engine.accumulate(tb, self.loss_fn, parts.ctx, self.temperature, self.top_k, self.top_p)
        parts.loss += acc.loss
        for k, v in acc.metrics.items():
            parts.metrics[k] = parts.metrics.get(k, 0.0) + v
        parts.count += 1

    def finish_parts(self) -> dict[str, float]:
        """The step's optimizer step on the parts' gradients, rescaled from the provisional
        totals to the real ones; the step's figures, as ``train`` reports them."""
        parts, self._parts = self._parts, None
        if parts is None or parts.count == 0:
            raise RuntimeError("finish_parts without a part trained")
        from asyncflow.algorithms.losses import renormalise

        real = LossContext(num_tokens=max(parts.num_tokens, 1.0), num_seqs=max(parts.num_seqs, 1.0))
        token_scale = renormalise("token-mean", parts.ctx, real)
        loss_scale = renormalise(self.cfg.algorithm.loss.agg, parts.ctx, real)
        grad_norm, lr = self.engine.apply_gradients(loss_scale)
        # every loss metric is a token mean under the context, but pg_loss (the loss's own aggregation)
        metrics = {k: v * (loss_scale if k == "pg_loss" else token_scale) for k, v in parts.metrics.items()}
        quantiles = ratio_quantiles(torch.cat(self.log_ratios)) if self.log_ratios else {}
        self.log_ratios.clear()
        out = {"loss": parts.loss * loss_scale, "grad_norm": grad_norm, **metrics, "lr": lr, **quantiles}
        out["stream_parts"] = float(parts.count)
        if parts.kl_tokens:
            out["kl"] = parts.kl_sum / parts.kl_tokens
        return out

    def batch_kl(self, tb: TokenBatch, alg) -> tuple[float, int]:
        """The global batch's KL to the reference as verl's controller measures it (each
        row's token mean of ``kl_estimator`` on the rollout's log-probs, averaged over
        rows) and its rows (a collective when distributed)."""
        from asyncflow.algorithms.kl import kl_per_token

        assert tb.rollout_logp is not None and tb.ref_logp is not None  # kl_coef > 0 runs the reference
        mask_BT = tb.response_mask.float()
        kl_B = (kl_per_token(tb.rollout_logp, tb.ref_logp, alg.kl_estimator) * mask_BT).sum(1) / mask_BT.sum(1).clamp(min=1.0)
        sums = torch.tensor([float(kl_B.sum()), float(len(kl_B))], dtype=torch.float64)
        if self.distributed:
            import torch.distributed as dist

            dist.all_reduce(sums)
        return float(sums[0] / sums[1].clamp(min=1.0)), int(sums[1])

    def advantages(
        self, tb: TokenBatch, rewards_B: torch.Tensor, group_ids: list[int], drop_B: torch.Tensor, alg=None
    ) -> dict[str, float]:
        """Sets the batch's advantages by the run's estimator (with a critic: its values
        first, and the returns and old values it trains on), drops the rows of
        ``drop_B`` from the mask, then trains the critic one step on the rest; returns
        the critic's figures (none without one)."""
        from asyncflow.algorithms.estimators import AdvantageInputs

        values_BT = None
        if self.critic is not None:
            with phase("values"):
                values_BT = self.critic.forward(tb).values
        with phase("advantages"):
            est = self.estimate(AdvantageInputs(tb, rewards_B, group_ids, alg or self.cfg.algorithm, values_BT))
        tb.advantages, tb.returns, tb.old_values = est.advantages_BT, est.returns_BT, values_BT
        drop_truncated(tb, drop_B)
        if self.critic is None:
            return {}
        from asyncflow.algorithms.estimators import ppo_config
        from asyncflow.algorithms.ppo import critic_loss_fn

        critic_result = self.critic.train_step(tb, critic_loss_fn(ppo_config(self.cfg.algorithm)))
        return {"critic_loss": critic_result.loss, **{f"critic_{k}": v for k, v in critic_result.metrics.items()}}

    def update(self, tb: TokenBatch) -> dict[str, float]:
        """``algorithm.epochs`` optimizer steps on the batch; the last step's figures,
        with the quantiles of pi_prox / mu over this rank's response tokens."""
        alg = self.cfg.algorithm
        if alg.epochs > 1 and self.loss_entry.recompute_prox:
            # Every epoch's ratio is against the policy before this step's first update
            # (and the IS weight is pi_old / mu, not pi_now / mu). A collective: every
            # rank takes this branch, as epochs is the same everywhere.
            with phase("prox_logp"):
                tb.prox_logp = self.engine.forward(tb, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p).logp
        self.log_ratios.clear()
        for epoch in range(alg.epochs):
            result = self.engine.train_step(tb, self.loss_fn, self.temperature, self.top_k, self.top_p)
            if epoch == 0:  # before any update: the mismatch of the data as it came
                quantiles = ratio_quantiles(torch.cat(self.log_ratios)) if self.log_ratios else {}
            self.log_ratios.clear()
        return {"loss": result.loss, "grad_norm": result.grad_norm, **result.metrics, **quantiles}

    def batch_figures(self, columns: dict[str, list]) -> dict[str, float]:
        """Rows, tokens, rewards (before overlong shaping) and the overlong figures of
        the global batch: this rank's, summed (max for ``reward_max``) over every rank
        when distributed (a collective)."""
        rewards = self.rewards(columns)
        penalty_B, truncated_B, drop_B = self.overlong(columns)
        response = float(sum(len(r) for r in columns["response_ids"]))
        prompt = float(sum(len(p) for p in columns["prompt_ids"]))
        over = float(len(fit_to_budget({k: columns[k] for k in ("prompt_ids", "response_ids")}, self.budget)[1]))
        sums = torch.tensor(
            [
                float(len(rewards)),
                float(rewards.sum()),
                response,
                prompt,
                float(truncated_B.sum()),
                float(penalty_B.abs().sum()),  # penalties are <= 0
                float(drop_B.sum()),
                over,
            ],
            dtype=torch.float64,
        )
        if self.multiturn:  # the environment figures: rows with a tool call, calls, errors, env reward
            sums = torch.cat([sums, torch.tensor(env_sums(columns), dtype=torch.float64)])
        top = torch.tensor([float(rewards.max()) if len(rewards) else -np.inf], dtype=torch.float64)
        if self.distributed:
            import torch.distributed as dist

            dist.all_reduce(sums)
            dist.all_reduce(top, op=dist.ReduceOp.MAX)
        n, reward_sum, response, prompt, truncated, penalty, dropped, over = sums.tolist()[:8]
        env: dict[str, float] = {}
        if self.multiturn:
            with_calls, calls, errors, env_reward, model_tokens = sums.tolist()[8:]
            env = {
                "env/tool_call_rate": with_calls / max(n, 1.0),
                "env/tool_calls_mean": calls / max(n, 1.0),
                "env/error_rate": errors / max(n, 1.0),
                "env/reward_mean": env_reward / max(n, 1.0),
                "env/model_token_frac": model_tokens / max(response, 1.0),
            }
        return {
            **env,
            "samples": n,
            "reward_mean": reward_sum / max(n, 1.0),
            "reward_max": top.item(),
            "response_tokens": response,
            "tokens": response + prompt,
            "truncated_frac": truncated / max(n, 1.0),
            "overlong_penalty_mean": penalty / max(n, 1.0),
            "truncated_masked_frac": dropped / max(n, 1.0),
            "rows_cut_to_context": over,
        }

    def export_weights(self, keep: bool = True) -> list[tuple[str, torch.Tensor]]:
        """A cpu snapshot of the full policy weights (fresh copies the engine will not
        touch again). A gather on every rank: ranks that do not publish pass
        ``keep=False`` and hold one tensor at a time."""
        if keep:
            return list(self.engine.export_weights())
        for _ in self.engine.export_weights():
            pass
        return []

    def save(self, path: Path) -> None:
        """Model (+ critic) with optimizer into ``path`` (collective; rank 0 writes)."""
        self.engine.save_checkpoint(str(path / "model"), with_optimizer=True)
        if self.kl_adaptive and (not self.distributed or torch.distributed.get_rank() == 0):  # equal on every rank
            (path / KL_CTRL_FILE).write_text(json.dumps({"kl_coef": self.kl_ctrl.value}))
        if self.critic is not None:
            self.critic.save_checkpoint(str(path / "critic"), with_optimizer=True)


def staleness(tb: TokenBatch, columns: dict[str, list], versions: list[int] | None, step: int) -> torch.Tensor:
    """Each response token's staleness, ``step`` (the trainer's version) minus the version
    that sampled it: its ``token_versions`` entry with partial rollout, else its row's
    ``versions[b]`` ([B, T], 0 off the response)."""
    if versions is None:
        raise ValueError("this loss needs each row's policy version (PolicyUpdate.train(..., versions, step))")
    on_BT = (tb.response_mask > 0).float()
    version_BT = torch.tensor(versions, dtype=torch.float32)[:, None].expand_as(on_BT).clone()
    for b, (prompt, token_versions) in enumerate(zip(columns["prompt_ids"], columns.get("token_versions", []))):
        start = len(prompt)
        version_BT[b, start : start + len(token_versions)] = torch.as_tensor(np.asarray(token_versions), dtype=torch.float32)
    return (step - version_BT) * on_BT


def drop_truncated(tb: TokenBatch, drop_B: torch.Tensor) -> None:
    """Take the rows of ``drop_B`` out of the loss (``mask_truncated``): their response
    mask becomes 0, after the advantages are computed, so their group's statistics
    still count them, and before any training, so the engine's loss denominators
    (``LossContext``, from this mask, summed over ranks) count only the rest."""
    if drop_B.any():
        from asyncflow.algorithms.overlong import drop_rows

        tb.response_mask = drop_rows(tb.response_mask, drop_B)


@dataclass
class _Parts:
    """The running sums of a step streamed in parts (``PolicyUpdate.begin_parts``)."""

    ctx: LossContext  # provisional: the losses are normalised by it, the gradients rescaled at the end
    num_tokens: float = 0.0  # the real totals, summed over the parts
    num_seqs: float = 0.0
    loss: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    kl_sum: float = 0.0
    kl_tokens: float = 0.0
    count: int = 0


def reward_kl_sums(tb: TokenBatch, alg) -> tuple[float, float]:
    """``kl_in_reward``'s figure: the sum over response tokens of the KL of the rollout's
    log-probs to the reference's, and the tokens summed."""
    from asyncflow.algorithms.kl import kl_per_token

    mask_BT = tb.response_mask
    assert tb.rollout_logp is not None and tb.ref_logp is not None  # read above; kl_coef > 0 runs the reference
    kl_BT = kl_per_token(tb.rollout_logp, tb.ref_logp, alg.kl_estimator) * mask_BT
    return float(kl_BT.sum()), float(mask_BT.sum())
