"""The ``[algorithm.loss]`` sections: one msgspec Struct per policy loss, tagged by its
registry name (``name = "ppo_clip"``), and the ``[algorithm.kl_ctrl]`` ones (``type =
"fixed"`` / ``"adaptive"``, built by ``kl_control.py``). Torch-free, so the run config embeds them
without importing torch; the loss functions that read them live beside the math
(``grpo.py``) and are found through ``registry.py``. ``registry.LossConfig`` is the
union of them all.

Invariants:
- A Struct's ``tag`` is its key in ``registry.POLICY_LOSSES``; ``LossConfig`` is the
  union the config decodes (one member per loss), so ``name`` picks the Struct and
  a key of another loss is an unknown key.
- Every field has a default, a range and a description (docs/config.md is generated
  from them); rules between fields are the Struct's ``check``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta

from asyncflow.core.schema import Refused

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum"]
"""How per-token losses reduce to the step's loss (``losses.aggregate``)."""

AGG_DESCRIPTION = (
    "How the per-token losses reduce: token-mean (over every response token of the step), "
    "seq-mean-token-mean (each sequence's token mean, then the mean over sequences), seq-mean-token-sum (each "
    "sequence's token sum, then the mean over sequences), seq-mean-token-sum-norm (Dr. GRPO: seq-mean-token-sum "
    "divided by the constant rollout.sampling.max_new_tokens, so no response's length scales its tokens' weight), "
    "token-sum (the sum over every response token of the step, no division)."
)


class PPOClipLoss(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag="ppo_clip", tag_field="name"):
    """The PPO clipped surrogate (GRPO's and PPO's actor loss): ``max(-A r, -A clip(r, 1 -
    clip_low, 1 + clip_high))`` per token, bounded by ``-A dual_clip`` for negative
    advantages, reduced by ``agg``; the ratio's denominator and the off-policy weight
    follow ``[algorithm]`` ``clip_against`` and ``is_*``. ``name = "ppo_clip"``."""

    clip_low: Annotated[float, Meta(gt=0, lt=1, description="Lower clip: the ratio is held at 1 - clip_low or above.")] = 0.2
    clip_high: Annotated[
        float,
        Meta(
            gt=0,
            description="Upper clip: the ratio is held at 1 + clip_high or below. Above clip_low it is DAPO's clip-higher "
            "(0.28), which lets unlikely tokens with a positive advantage gain more per step.",
        ),
    ] = 0.2
    dual_clip: Annotated[
        float,
        Meta(
            ge=0,
            description="Dual clip (Ye et al. 2020): for a negative advantage the loss is at most -A x dual_clip, so a "
            "token whose ratio has grown far does not push its probability down without bound. 0: off; otherwise above "
            "1 (3.0 is usual).",
        ),
    ] = 0.0
    agg: Annotated[AggMode, Meta(description=AGG_DESCRIPTION)] = "token-mean"

    def check(self, run: object) -> None:
        if self.dual_clip != 0 and self.dual_clip <= 1:
            raise Refused("dual_clip", "use 0 (off) or a bound above 1 such as 3.0")


class GSPOLoss(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag="gspo", tag_field="name"):
    """GSPO: PPO's clip on each response's geometric-mean ratio ``exp(mean_t log(pi / old))``,
    so a response is kept or clipped whole (algorithms/gspo.py). ``name = "gspo"``."""

    clip_low: Annotated[
        float,
        Meta(gt=0, lt=1, description="Lower clip of the sequence ratio: held at 1 - clip_low or above (paper: 3e-4)."),
    ] = 3e-4
    clip_high: Annotated[
        float,
        Meta(gt=0, description="Upper clip of the sequence ratio: held at 1 + clip_high or below (paper: 4e-4)."),
    ] = 4e-4
    agg: Annotated[
        Literal["seq-mean-token-mean"],
        Meta(description="GSPO's objective is a mean over responses: seq-mean-token-mean only."),
    ] = "seq-mean-token-mean"


class CISPOLoss(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag="cispo", tag_field="name"):
    """CISPO (MiniMax-M1): ``-sg(clip(r, 1 - clip_low, 1 + clip_high)) A log pi`` per token, the
    importance weight clipped and without gradient, so a clipped token still gets the
    gradient of its log-prob (algorithms/cispo.py). ``name = "cispo"``."""

    clip_low: Annotated[
        float,
        Meta(
            gt=0,
            le=1,
            description="Lower clip of the weight: held at 1 - clip_low or above; 1 (the default, as MiniMax-M1 and TRL): no "
            "lower bound.",
        ),
    ] = 1.0
    clip_high: Annotated[
        float,
        Meta(
            gt=0,
            description="Upper clip of the weight: held at 1 + clip_high or below (4.0: TRL's and ScaleRL's epsilon_max of 5).",
        ),
    ] = 4.0
    agg: Annotated[AggMode, Meta(description=AGG_DESCRIPTION)] = "token-mean"


class DecoupledPPOLoss(PPOClipLoss, tag="decoupled_ppo"):
    """AReaL's decoupled PPO with the log-linear proximal approximation: the PPO clip against
    pi_prox, times the truncated weight pi_prox / mu (``[algorithm]`` ``is_truncation``), where
    log pi_prox is interpolated between mu's and the current log-prob by each token's
    policy version instead of recomputed by a forward pass (algorithms/decoupled.py).
    Needs ``clip_against = "proximal"``. ``name = "decoupled_ppo"``."""

    def check(self, run: Any) -> None:
        super().check(run)
        if run.algorithm.clip_against != "proximal":
            raise Refused(
                "name",
                'decoupled_ppo clips against the proximal policy: set [algorithm] clip_against = "proximal"',
                value="decoupled_ppo",
            )


class M2POLoss(PPOClipLoss, tag="m2po"):
    """M2PO (AReaL): the PPO clip with the tokens of the largest (log mu - log pi_prox)^2
    dropped until the mean of that second moment over the rest is below
    ``m2_threshold`` (algorithms/m2po.py). ``name = "m2po"``."""

    m2_threshold: Annotated[
        float,
        Meta(
            gt=0,
            description="The bound on the mean second moment (log mu - log pi_prox)^2 of the micro-batch's kept tokens "
            "(the paper's 0.04).",
        ),
    ] = 0.04


class FixedKL(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True, tag="fixed", tag_field="type"):
    """The coefficient stays ``[algorithm] kl_coef``. ``type = "fixed"``."""


class AdaptiveKL(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True, tag="adaptive", tag_field="type"):
    """Ziegler et al.'s adaptive coefficient, from ``kl_coef`` towards a target KL. ``type = "adaptive"``."""

    target_kl: Annotated[
        float, Meta(gt=0, description="The batch KL to the reference the coefficient steers towards (verl: 0.1).")
    ] = 0.1
    horizon: Annotated[
        int,
        Meta(ge=1, description="Rows over which the coefficient changes by at most 20% (verl: 10000)."),
    ] = 10000


KLControl = Union[FixedKL, AdaptiveKL]  # noqa: UP007 (a msgspec tagged union)
