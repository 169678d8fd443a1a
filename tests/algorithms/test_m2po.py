"""M2PO (algorithms/m2po.py): the fewest tokens of largest second moment
(log mu - log pi_prox)^2 are dropped for the mean of the rest to be below the
threshold, checked against a direct search; the rest get ppo_clip's loss; by name."""

from __future__ import annotations

import itertools

import pytest
import torch
from loss_inputs import grad, inputs, registry_loss

from asyncflow.algorithms.m2po import m2_keep

pytestmark = pytest.mark.timeout(30)


def _fewest_dropped(m2, threshold):
    """By brute force: the least k such that dropping the k largest leaves a mean below threshold."""
    order = sorted(range(len(m2)), key=lambda i: -m2[i])
    for k in range(len(m2)):
        rest = [m2[i] for i in order[k:]]
        if sum(rest) / len(rest) < threshold:
            return set(order[:k])
    return set(order[: len(m2) - 1])


@pytest.mark.parametrize(("seed", "threshold"), itertools.product(range(4), [0.01, 0.04, 0.5, 1e-9]))
def test_the_mask_drops_the_fewest_largest_second_moments(seed, threshold):
    m2 = (torch.randn(23, generator=torch.Generator().manual_seed(seed)) * 0.3) ** 2
    keep = m2_keep(m2, threshold)
    assert {i for i in range(23) if keep[i] == 0} == _fewest_dropped(m2.tolist(), threshold)
    assert keep.sum() >= 1


def test_m2po_is_ppo_clip_on_the_kept_tokens():
    logp, mu, adv, mask = inputs(0, spread=0.3)
    toml = "[algorithm.loss]\nname = 'm2po'\nm2_threshold = 0.04\nclip_high = 0.28\n"
    loss, metrics = registry_loss(toml, logp, mu, adv, mask)
    prox = logp.detach()
    keep = torch.zeros_like(mask)
    keep[mask > 0] = m2_keep(((mu - prox) ** 2)[mask > 0], 0.04)
    assert 0 < keep.sum() < mask.sum()
    ref_logp = logp.detach().clone().requires_grad_(True)
    r = torch.exp(ref_logp - mu)
    pg = torch.maximum(-adv * r, -adv * r.clamp(0.8, 1.28))
    ref = (pg * keep * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad(loss, logp), grad(ref, ref_logp), rtol=1e-6, atol=1e-7)
    assert metrics["m2_masked_frac"] == pytest.approx(1 - float(keep.sum() / mask.sum()), abs=1e-6)
