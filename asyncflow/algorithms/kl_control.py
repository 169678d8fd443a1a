"""KL coefficient controllers: the controller each ``[algorithm.kl_ctrl]`` Struct builds (the
Structs, tagged by ``type``, are in ``loss_configs.py`` with the rest of the torch-free schema).

- ``fixed`` (the default): the coefficient stays ``[algorithm] kl_coef``.
- ``adaptive`` (Ziegler et al. 2019, verl's ``AdaptiveKLController``): starting from
  ``kl_coef``, after each step

      kl_coef <- kl_coef * (1 + clip(KL / target_kl - 1, -0.2, 0.2) * n / horizon)

  with KL the step's batch KL to the reference (each row's token mean of
  ``kl_estimator`` on the rollout's log-probs, averaged over the rows, as verl measures
  it) and n the step's rows: the coefficient rises while the policy is further from the
  reference than ``target_kl`` and falls while it is closer, by at most 20% per
  ``horizon`` rows.

Invariant: every trainer rank holds the same value (the update's KL and n are the
global batch's); the value is saved with the checkpoint and restored on resume.
"""

from __future__ import annotations

from asyncflow.algorithms.loss_configs import AdaptiveKL, KLControl


class Fixed:
    def __init__(self, value: float):
        self.value = value

    def update(self, current_kl: float, num_rows: int) -> None:
        pass


class Adaptive:
    def __init__(self, cfg: AdaptiveKL, value: float):
        self.cfg, self.value = cfg, value

    def update(self, current_kl: float, num_rows: int) -> None:
        error = min(max(current_kl / self.cfg.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * num_rows / self.cfg.horizon


def controller(cfg: KLControl, kl_coef: float) -> Fixed | Adaptive:
    """The controller of ``[algorithm.kl_ctrl]``, starting at ``kl_coef``."""
    return Adaptive(cfg, kl_coef) if isinstance(cfg, AdaptiveKL) else Fixed(kl_coef)
