"""The algorithm registry: advantage estimators and policy losses, keyed by the names
a config gives them (``[algorithm] name``, ``[algorithm.loss] name``).

Torch-free: the run config reads the entries (what an estimator needs, a loss's
Struct) without importing torch; the functions are named as ``"module:function"``
and imported when a trainer builds them (``resolve``).

Adding one:
- an advantage estimator: a function ``f(inputs: AdvantageInputs) -> Advantages``
  (``estimators.py``) and one ``Estimator`` entry below saying what it needs (a critic,
  a reference, prompt groups). Roles, preflight and the planner read those needs from
  here; nothing else names an estimator.
- a policy loss: its ``[algorithm.loss]`` Struct in ``loss_configs.py`` (tagged with
  the name, torch-free), one module with its builder ``build(alg, log_ratio_sink) ->
  LossFn`` (``gspo.py``), and one ``PolicyLoss`` entry below. The
  config's ``[algorithm.loss]`` decodes to ``LossConfig``, the union of the entries'
  Structs, and docs/config.md documents each.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

from asyncflow.algorithms.loss_configs import AdaptiveKL, CISPOLoss, DecoupledPPOLoss, FixedKL, GSPOLoss, M2POLoss, PPOClipLoss


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator and what the run must provide for it."""

    name: str
    summary: str
    compute: str
    """``"module:function"``: ``f(AdvantageInputs) -> Advantages``."""
    needs_critic: bool = False
    """A critic role (value model, ``[critic]``) runs and trains beside the policy."""
    needs_reference: bool = False
    """A reference policy runs even with ``kl_coef = 0``."""
    grouped: bool = False
    """Advantages are relative within prompt groups: ``group_size >= 2``, and dynamic
    sampling (which drops groups of equal rewards) applies."""
    group_local: bool = False
    """A row's advantages depend on its prompt group's rows only (nothing batch-wide such
    as whitening): a step streamed in parts of whole groups (``workflow.stream_step``)
    gets the advantages the whole batch would."""


@dataclass(frozen=True)
class PolicyLoss:
    """A policy loss: its ``[algorithm.loss]`` Struct and its builder."""

    name: str
    summary: str
    config: type
    build: str
    """``"module:function"``: ``build(alg, log_ratio_sink, horizon) -> LossFn``; ``alg`` is the
    run's ``[algorithm]`` (``alg.loss`` is an instance of ``config``), ``horizon`` the run's
    ``rollout.sampling.max_new_tokens`` (the ``seq-mean-token-sum-norm`` divisor)."""
    needs_staleness: bool = False
    """The batch carries each token's staleness (trainer version minus the version that
    sampled it) as ``extra["staleness"]``."""
    recompute_prox: bool = True
    """With ``epochs > 1`` the trainer recomputes pi_prox by a forward pass; False: the
    loss approximates it (no forward pass)."""


ESTIMATORS: dict[str, Estimator] = {
    e.name: e
    for e in (
        Estimator(
            "grpo",
            "each response's reward minus its prompt group's mean, divided by the group's std (std_normalize)",
            "asyncflow.algorithms.estimators:grpo",
            grouped=True,
            group_local=True,
        ),
        Estimator(
            "rloo",
            "REINFORCE leave-one-out: each response's reward minus the mean reward of the other responses to its prompt",
            "asyncflow.algorithms.estimators:rloo",
            grouped=True,
            group_local=True,
        ),
        Estimator(
            "reinforce_plus_plus",
            "REINFORCE++: the reward on the last token (minus the per-token KL with kl_in_reward), returns discounted by gamma, "
            "whitened over the batch's response tokens; no critic, no groups",
            "asyncflow.algorithms.estimators:reinforce_plus_plus",
        ),
        Estimator(
            "reinforce_plus_plus_baseline",
            "REINFORCE++ with a baseline: each response's reward minus its prompt group's mean, on every response token, "
            "whitened over the batch's response tokens",
            "asyncflow.algorithms.estimators:reinforce_plus_plus_baseline",
            grouped=True,
        ),
        Estimator(
            "ppo",
            "GAE (gamma, lam) over a critic's values, the reward on the last token, whitened over the batch",
            "asyncflow.algorithms.estimators:gae",
            needs_critic=True,
        ),
    )
}

POLICY_LOSSES: dict[str, PolicyLoss] = {
    p.name: p
    for p in (
        PolicyLoss(
            "ppo_clip",
            "PPO's clipped surrogate with clip-higher, dual clip and the off-policy weight and mask",
            PPOClipLoss,
            "asyncflow.algorithms.grpo:build_ppo_clip",
        ),
        PolicyLoss(
            "gspo",
            "GSPO's clip on each response's geometric-mean ratio: a response is kept or clipped whole",
            GSPOLoss,
            "asyncflow.algorithms.gspo:build",
        ),
        PolicyLoss(
            "cispo",
            "CISPO's clipped importance weight, without gradient, times the log-prob: every token keeps a gradient",
            CISPOLoss,
            "asyncflow.algorithms.cispo:build",
        ),
        PolicyLoss(
            "decoupled_ppo",
            "AReaL's decoupled PPO with pi_prox interpolated, in log space, between mu and pi by policy version (no forward pass)",
            DecoupledPPOLoss,
            "asyncflow.algorithms.decoupled:build",
            needs_staleness=True,
            recompute_prox=False,
        ),
        PolicyLoss(
            "m2po",
            "M2PO: ppo_clip on the tokens left once the largest (log mu - log pi_prox)^2 are dropped to bring its mean under m2_threshold",
            M2POLoss,
            "asyncflow.algorithms.m2po:build",
        ),
    )
}

KL_CONTROLLERS: dict[str, type] = {"fixed": FixedKL, "adaptive": AdaptiveKL}
"""``[algorithm.kl_ctrl] type``: the KL coefficient controllers' Structs (``kl_control.py``
builds each one's controller)."""

LossConfig: Any = Union[tuple(p.config for p in POLICY_LOSSES.values())]  # noqa: UP007 (built at run time)
"""What ``[algorithm.loss]`` decodes to: the union of the losses' Structs, told apart by ``name``."""


def estimator(name: str) -> Estimator:
    """The estimator called ``name``; a ``KeyError`` that lists the known ones."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise KeyError(f"unknown advantage estimator {name!r}; known: {', '.join(ESTIMATORS)}") from None


def policy_loss(name: str) -> PolicyLoss:
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise KeyError(f"unknown policy loss {name!r}; known: {', '.join(POLICY_LOSSES)}") from None


def loss_name(config: Any) -> str:
    """The registry name of an ``[algorithm.loss]`` Struct (its tag)."""
    return str(type(config).__struct_config__.tag)


def resolve(ref: str) -> Callable[..., Any]:
    """The function a ``"module:function"`` reference names (imported now)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)
