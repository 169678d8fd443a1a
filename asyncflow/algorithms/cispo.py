"""CISPO (MiniMax-M1, Chen et al. 2025, eq. 4): ``[algorithm.loss] name = "cispo"``.

Shape legend: B sequences, T tokens.

    w_t    = clip(pi(y_t) / old(y_t), 1 - clip_low, 1 + clip_high)      no gradient (sg)
    loss_t = -sg(w_t) A_t log pi(y_t)

PPO's clip zeroes the gradient of a token whose ratio left the trust region; CISPO clips
the importance weight instead and keeps every token's gradient (``A w grad log pi``), so
the rare tokens that open a reasoning step (ratios far above 1 + eps) still learn. The
defaults (no lower bound, upper 1 + 4) are MiniMax-M1's and TRL's.

``old`` is mu with ``clip_against = "behaviour"`` and pi_prox otherwise; the off-policy
weight and mask, the KL and the entropy terms of ``[algorithm]`` apply as to ``ppo_clip``.
Its Struct, ``CISPOLoss``, is in ``loss_configs.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncflow.algorithms.losses import MAX_LOG_RATIO

if TYPE_CHECKING:
    import torch

    from asyncflow.algorithms.loss_configs import CISPOLoss
    from asyncflow.engines.base import LossFn


def cispo_token_loss(
    logp_BT: torch.Tensor, old_BT: torch.Tensor, adv_BT: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: -sg(clip(r, 1 - clip_low, 1 + clip_high)) A log pi. Returns (loss_BT,
    clipped_BT as 0/1: the weight was held at a bound)."""
    ratio_BT = (logp_BT.detach() - old_BT).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()
    weight_BT = ratio_BT.clamp(1.0 - clip_low, 1.0 + clip_high)
    return -weight_BT * adv_BT * logp_BT, (weight_BT != ratio_BT).float()


def build(alg: Any, log_ratio_sink: list[torch.Tensor] | None = None, horizon: int = 0) -> LossFn:
    """The registry's ``cispo``: the ``loss_fn`` for ``TrainEngine.train_step``."""
    import msgspec

    from asyncflow.algorithms.grpo import algorithm_terms
    from asyncflow.algorithms.losses import aggregate

    loss: CISPOLoss = alg.loss
    terms = msgspec.structs.replace(algorithm_terms(alg), agg=loss.agg, horizon=horizon)

    def loss_fn(out, mb, ctx):
        mask_BT, prox_BT, old_BT = terms.ratio_inputs(out, mb)
        pg_BT, clipped_BT = cispo_token_loss(out.logp, old_BT, mb.advantages, loss.clip_low, loss.clip_high)
        pg_BT, metrics = terms.off_policy(pg_BT, prox_BT, mb, mask_BT, ctx, log_ratio_sink)
        metrics["pg_loss"] = float(aggregate(pg_BT.detach(), mask_BT, terms.agg, ctx, horizon))
        metrics["clip_frac"] = float(aggregate(clipped_BT, mask_BT, "token-mean", ctx))
        return aggregate(pg_BT + terms.regularisers(out, mb, mask_BT, ctx, metrics), mask_BT, terms.agg, ctx, horizon), metrics

    return loss_fn
