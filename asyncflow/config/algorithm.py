"""``[algorithm]``: the advantage estimator, the policy loss (``[algorithm.loss]``, a union of the
registry's loss Structs) and the off-policy corrections."""

from __future__ import annotations

import math
import typing
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from asyncflow.algorithms import registry
from asyncflow.algorithms.loss_configs import FixedKL, KLControl, PPOClipLoss
from asyncflow.config._section import Section
from asyncflow.core.schema import Refused
from asyncflow.engines.config import (
    Count,
    Fraction,
    NonNegFloat,
)

if typing.TYPE_CHECKING:  # statically the default loss's Struct; at run time the union of the registry's
    LossConfig = PPOClipLoss
else:
    LossConfig = registry.LossConfig


class AlgorithmConfig(Section):
    """The RL algorithm and its knobs."""

    name: Annotated[
        str,
        Meta(
            description="The advantage estimator, a name of the registry (algorithms/registry.py, which says what each needs): "
            + "; ".join(
                f"{e.name}: {e.summary}" + (" (a critic trains beside the policy)" if e.needs_critic else "")
                for e in registry.ESTIMATORS.values()
            )
            + "."
        ),
    ] = "grpo"
    loss: Annotated[
        LossConfig,
        Meta(
            description="The policy loss, a Struct of its own keyed by ``name`` (registry: "
            + ", ".join(registry.POLICY_LOSSES)
            + ")."
        ),
    ] = msgspec.field(default_factory=PPOClipLoss)
    group_size: Annotated[Count, Meta(description="Responses sampled per prompt (GRPO's n).")] = 8
    std_normalize: Annotated[bool, Meta(description="GRPO: divide group-centred rewards by the group's std.")] = True
    kl_coef: Annotated[
        NonNegFloat, Meta(description="Weight of the KL to the reference policy; 0 disables the reference role.")
    ] = 0.0
    kl_ctrl: Annotated[
        KLControl,
        Meta(
            description="How kl_coef moves during the run, a Struct keyed by ``type``: fixed (the default: it stays "
            "kl_coef) or adaptive (verl's AdaptiveKLController: from kl_coef, multiplied after each step by 1 + "
            "clip(KL / target_kl - 1, -0.2, 0.2) x rows / horizon, KL the batch's to the reference; algorithms/kl_control.py). "
            "Metric ``kl_coef``."
        ),
    ] = msgspec.field(default_factory=FixedKL)
    kl_estimator: Annotated[
        Literal["k1", "k2", "k3"],
        Meta(
            description="KL estimator per token, with log r = log ref - log pi: k1 = -log r, k2 = (log r)^2 / 2 (log r "
            "within +-10), k3 = e^(log r) - 1 - log r (log r within +-20, the estimate within +-10, as verl's low_var_kl): "
            "algorithms/kl.py."
        ),
    ] = "k3"
    kl_in_reward: Annotated[
        bool,
        Meta(
            description="Put the KL penalty into the reward instead of the loss, estimated by ``kl_estimator`` on the rollout "
            "log-probs. GRPO: each response's reward minus kl_coef x its KL summed over the response tokens, before the "
            "group normalisation. PPO: minus kl_coef x the token's KL on every response token's reward, before GAE."
        ),
    ] = False
    entropy_coef: Annotated[NonNegFloat, Meta(description="Entropy bonus weight.")] = 0.0
    is_truncation: Annotated[
        NonNegFloat,
        Meta(
            description="Off-policy correction: cap of the importance weight pi_prox / mu between the trainer's policy before the "
            'update and the rollout policy of stale samples (0 disables; with ``clip_against = "proximal"`` only). Per '
            "token or per sequence by ``is_level``."
        ),
    ] = 2.0
    gamma: Annotated[Fraction, Meta(description="PPO: discount.")] = 1.0
    lam: Annotated[Fraction, Meta(description="PPO: GAE lambda.")] = 0.95
    value_clip: Annotated[NonNegFloat, Meta(description="PPO: value clipping range.")] = 0.2
    epochs: Annotated[
        Count,
        Meta(
            description="Optimizer passes over each global batch. Above 1, the trainer first recomputes the batch's log-probs (one "
            "forward pass, pi_prox) so that every pass clips its ratio against the policy before the first one."
        ),
    ] = 1
    clip_against: Annotated[
        Literal["proximal", "behaviour"],
        Meta(
            description="What the PPO ratio is clipped against. behaviour (the default) is what keeps async runs learning as much as "
            "sync (docs/results.md). proximal (decoupled PPO): pi / pi_prox, pi_prox the policy before this update, times "
            "the truncated importance weight pi_prox / mu (``is_truncation``); with one optimizer step per batch the ratio "
            "is 1 and only that weight corrects staleness. behaviour (coupled PPO): pi / mu, mu the rollout policy that "
            "generated the sample, with no separate weight (``is_truncation`` unused): a trust region around the data's "
            "policy, which limits drift on stale samples. See docs/algorithms.md."
        ),
    ] = "behaviour"
    is_level: Annotated[
        Literal["token", "sequence"],
        Meta(
            description="Level of the importance ratio pi_prox / mu used by ``is_truncation`` and the mask: each token's own, or one "
            "per sequence (the product of its token ratios, exp of the sum of their logs over the response) on every token "
            "of it."
        ),
    ] = "token"
    is_mask_low: Annotated[
        float,
        Meta(
            ge=0,
            lt=1,
            description='Masked importance sampling (IcePop style): tokens (whole sequences with ``is_level = "sequence"``) whose '
            "pi_prox / mu is below this are dropped from the policy-gradient term; counted in the metric "
            "``is_masked_frac``. 0: no lower bound; otherwise below 1 (e.g. 0.5).",
        ),
    ] = 0.0
    is_mask_high: Annotated[
        NonNegFloat,
        Meta(
            description="Masked importance sampling: tokens (sequences) whose pi_prox / mu is above this are dropped too. 0: no upper "
            "bound; otherwise above 1 (e.g. 2.0). Both bounds 0: no mask."
        ),
    ] = 0.0
    overlong_buffer: Annotated[
        int,
        Meta(
            ge=0,
            description="Overlong shaping (DAPO): the last this many tokens before ``rollout.sampling.max_new_tokens`` M are a "
            "buffer over which a response's reward falls linearly, from 0 at length M - buffer to -``overlong_penalty`` at "
            "length M (the stop token counts), before the advantages are computed. 0: no length penalty; otherwise below M. "
            "Metric ``overlong_penalty_mean``; see docs/algorithms.md.",
        ),
    ] = 0
    overlong_penalty: Annotated[
        float,
        Meta(
            ge=0,
            description="The penalty at ``rollout.sampling.max_new_tokens`` (DAPO's penalty factor): subtracted in full from the reward "
            "of a response of that length, in part within ``overlong_buffer``. Unused while ``overlong_buffer = 0``.",
        ),
    ] = 1.0
    mask_truncated: Annotated[
        bool,
        Meta(
            description='Drop the responses cut at ``rollout.sampling.max_new_tokens`` (finish reason "length") from the loss: their '
            "tokens get no gradient and leave the loss's token (sequence) mean, which runs over the remaining tokens "
            "(rows). They still count in their group's reward statistics. Metric ``truncated_masked_frac``; see "
            "docs/algorithms.md.",
        ),
    ] = False
    dynamic_sampling: Annotated[
        bool,
        Meta(
            description="Dynamic sampling (DAPO): the trainer drops the prompt groups whose rewards are all equal (zero GRPO "
            "advantage: no gradient) and trains on up to ``train.prompts_per_step`` of the others. The loader over-samples "
            "(``dynamic_sampling_oversample``) to keep the batch full; every dropped group is acked and recorded in "
            "trained.jsonl. GRPO only. Metrics ``filtered_frac``, ``kept_groups``; see docs/algorithms.md.",
        ),
    ] = False
    dynamic_sampling_metric: Annotated[
        str,
        Meta(
            description="With ``dynamic_sampling``: what must differ within a group for it to be kept (verl's "
            "filter_groups.metric). reward: the reward as the advantages see it (the reward column, custom roles' "
            "weighted scores and the overlong penalty; verl's 'reward'); score: the reward column alone, what the reward "
            "functions (or the environment) gave, so that a group the overlong penalty or a judge alone tells apart is "
            "dropped (verl's 'score' / 'acc' for an accuracy reward); or the name of a custom role's ``reward_column`` or "
            "``rm_score``: that column alone."
        ),
    ] = "reward"
    dynamic_sampling_oversample: Annotated[
        float,
        Meta(
            ge=1.0,
            le=16.0,
            description="With ``dynamic_sampling``: prompt groups loaded and generated per step, as a multiple of "
            "``train.prompts_per_step`` (rounded up). The informative groups beyond ``prompts_per_step`` are dropped as "
            "surplus; a step with fewer trains on fewer unless ``dynamic_sampling_max_rounds`` refills it. Unused while "
            "``dynamic_sampling = false``.",
        ),
    ] = 2.0
    dynamic_sampling_max_rounds: Annotated[
        int,
        Meta(
            ge=0,
            le=64,
            description="With ``dynamic_sampling``: refill (DAPO's 'keep sampling until the batch is full'). A step whose "
            "groups hold fewer than ``train.prompts_per_step`` informative ones asks the loader for another round of "
            "over-sampled groups for the same step, generated and scored like the first, up to this many rounds; then it "
            "trains on what it has (metric ``refill_short``). 0: no refill. Metrics ``refill_rounds``, "
            "``refill_groups``; see docs/algorithms.md.",
        ),
    ] = 0

    @property
    def estimator(self) -> registry.Estimator:
        """The registry's entry for ``name`` (what it needs: a critic, a reference, groups)."""
        return registry.estimator(self.name)

    @property
    def needs_critic(self) -> bool:
        return self.estimator.needs_critic

    @property
    def needs_reference(self) -> bool:
        """A reference policy runs: the KL term asks for its log-probs, or the estimator does."""
        return self.kl_coef > 0 or self.estimator.needs_reference

    def groups_per_step(self, prompts_per_step: int) -> int:
        """Prompt groups the loader allocates (and the rollout generates) per step of
        ``prompts_per_step`` (``train.prompts_per_step``), over-sampled with ``dynamic_sampling``."""
        if not self.dynamic_sampling:
            return prompts_per_step
        return math.ceil(prompts_per_step * self.dynamic_sampling_oversample - 1e-9)

    def rows_per_step(self, prompts_per_step: int) -> int:
        """Rows allocated per step: ``prompts_per_step x group_size`` unless dynamic sampling over-samples."""
        return self.groups_per_step(prompts_per_step) * self.group_size

    @property
    def refill_rounds(self) -> int:
        """Dynamic sampling's refill rounds per step at most (0: no refill)."""
        return self.dynamic_sampling_max_rounds if self.dynamic_sampling else 0

    def refill_headroom_rows(self, prompts_per_step: int) -> int:
        """Rows the loader leaves free when it allocates a new step, so that a refill
        round always fits: one round (``rows_per_step``) plus the informative rows a step
        may hold back while it waits (``prompts_per_step x group_size``); 0 without refill."""
        if not self.refill_rounds:
            return 0
        return self.rows_per_step(prompts_per_step) + prompts_per_step * self.group_size

    def check(self, run: object) -> None:
        if self.name not in registry.ESTIMATORS:
            raise Refused("name", f"not an advantage estimator of the registry; use one of {list(registry.ESTIMATORS)}")
        grouped = [e.name for e in registry.ESTIMATORS.values() if e.grouped]
        if self.dynamic_sampling and not self.estimator.grouped:
            raise Refused(
                "dynamic_sampling", f"filters prompt groups by their rewards: use a group estimator ({grouped}) or turn it off"
            )
        if self.dynamic_sampling and self.group_size < 2:
            raise Refused("dynamic_sampling", "a group of one response always has equal rewards: use group_size >= 2")
        if self.estimator.grouped and self.group_size < 2:
            raise Refused("group_size", f"{self.name} compares the responses of one prompt: use at least 2")
        if self.kl_ctrl != FixedKL() and self.kl_coef == 0:
            raise Refused("kl_ctrl", "an adaptive coefficient starts from kl_coef: set kl_coef > 0 (verl: 0.001)", "adaptive")
        if self.is_mask_high != 0 and self.is_mask_high <= 1:
            raise Refused("is_mask_high", "use 0 (no upper bound) or a ratio above 1 such as 2.0")
