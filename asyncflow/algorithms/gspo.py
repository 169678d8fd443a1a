"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): the PPO clip on a
sequence-level ratio, ``[algorithm.loss] name = "gspo"``.

Shape legend: B sequences, T tokens.

    s_i = exp( mean_t (logp_it - old_it) )          one ratio per response (its geometric mean)
    loss = seq-mean( max(-A_i s_i, -A_i clip(s_i, 1 - clip_low, 1 + clip_high)) )

The token form carries the same value and gradient: per token
``log s_it = logp_it - sg(logp_it) + sg(log s_i)`` (sg: no gradient), so the value is
``s_i`` on every token of the response and ``d s_it / d logp_it = s_i``; reduced with
``seq-mean-token-mean`` it is the sequence objective above, and its gradient is the
paper's ``A_i s_i / |y_i|`` per token (``tests/algorithms/test_gspo.py`` checks both
against the sequence-level formula). Since every token of a response shares one ratio,
a response is clipped whole or not at all; the clip range is that of a mean
log-ratio, hence about a thousandth of PPO's (the paper's 3e-4 / 4e-4).

``old`` is the rollout's log-prob (mu) with ``clip_against = "behaviour"`` and the
proximal one otherwise, and the off-policy weight and mask, the KL term and the
entropy bonus of ``[algorithm]`` apply as to ``ppo_clip`` (``grpo.py``).

Its ``[algorithm.loss]`` Struct, ``GSPOLoss``, is in ``loss_configs.py`` (torch-free: the run config embeds it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncflow.algorithms.loss_configs import GSPOLoss

if TYPE_CHECKING:
    import torch

    from asyncflow.engines.base import LossFn

MAX_SEQ_LOG_RATIO = 10.0
"""A response's mean log-ratio is held at or below this before exp (one response whose
policy moved far must not overflow the step's loss)."""


def sequence_log_ratio(logp_BT: torch.Tensor, old_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Each response's mean log(pi / old) over its tokens, [B] (0 for a response without
    tokens), held at ``MAX_SEQ_LOG_RATIO`` or below."""
    mask_BT = mask_BT.float()
    mean_B = ((logp_BT - old_BT) * mask_BT).sum(dim=1) / mask_BT.sum(dim=1).clamp(min=1.0)
    return mean_B.clamp(max=MAX_SEQ_LOG_RATIO)


def gspo_token_loss(
    logp_BT: torch.Tensor,
    old_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: max(-A s_it, -A clip(s_it, 1 - clip_low, 1 + clip_high)) with the token
    form of the sequence ratio (module docstring). Returns (loss_BT, clipped_BT as 0/1)."""
    import torch

    log_s_B = sequence_log_ratio(logp_BT, old_BT, mask_BT).detach()
    s_BT = torch.exp(logp_BT - logp_BT.detach() + log_s_B.unsqueeze(1))
    unclipped_BT = -adv_BT * s_BT
    clipped_BT = -adv_BT * s_BT.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped_BT, clipped_BT), (clipped_BT > unclipped_BT).float()


def build(alg: Any, log_ratio_sink: list[torch.Tensor] | None = None, horizon: int = 0) -> LossFn:
    """The registry's ``gspo``: the ``loss_fn`` for ``TrainEngine.train_step``. ``alg``: the
    run's ``[algorithm]`` (``alg.loss`` a ``GSPOLoss``)."""
    from asyncflow.algorithms.grpo import algorithm_terms
    from asyncflow.algorithms.losses import aggregate

    loss: GSPOLoss = alg.loss
    terms = algorithm_terms(alg)  # the off-policy, KL and entropy settings ppo_clip reads

    def loss_fn(out, mb, ctx):
        mask_BT, prox_BT, old_BT = terms.ratio_inputs(out, mb)
        pg_BT, clipped_BT = gspo_token_loss(out.logp, old_BT, mb.advantages, mask_BT, loss.clip_low, loss.clip_high)
        pg_BT, metrics = terms.off_policy(pg_BT, prox_BT, mb, mask_BT, ctx, log_ratio_sink)
        metrics["pg_loss"] = float(aggregate(pg_BT.detach(), mask_BT, loss.agg, ctx))
        metrics["clip_frac"] = float(aggregate(clipped_BT, mask_BT, "token-mean", ctx))
        return aggregate(pg_BT + terms.regularisers(out, mb, mask_BT, ctx, metrics), mask_BT, loss.agg, ctx), metrics

    return loss_fn
