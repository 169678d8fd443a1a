"""GSPO (algorithms/gspo.py, ``[algorithm.loss] name = "gspo"``): its token form has the
value and the gradient of the paper's sequence-level objective, computed here directly
from the formula (Zheng et al. 2025, eq. 5-7) on random tensors; a response is clipped
whole; the config selects it by name, through the registry alone."""

from __future__ import annotations

import msgspec
import pytest
import torch

from asyncflow.algorithms import registry
from asyncflow.algorithms.gspo import GSPOLoss, build
from asyncflow.config.load import ConfigError, load_config_text
from asyncflow.engines.base import ForwardOutput, LossContext, TokenBatch

B, T = 6, 9


def _inputs(seed: int, spread: float):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 5, 1, 7, 3, 8])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    old = -torch.rand(B, T, generator=g) * 3
    logp = (old + spread * torch.randn(B, T, generator=g)).requires_grad_(True)
    adv = torch.randn(B, generator=g)[:, None].expand(B, T).contiguous()  # one advantage per response
    return logp, old, adv, mask


def _paper(logp, old, adv, mask, low, high):
    """The sequence objective as the paper writes it: s_i = (pi(y_i) / old(y_i)) ^ (1 / |y_i|),
    loss = mean_i max(-A_i s_i, -A_i clip(s_i, 1 - low, 1 + high)); gradients through s_i."""
    s = torch.exp(((logp - old) * mask).sum(1) / mask.sum(1))
    a = adv[:, 0]
    return torch.maximum(-a * s, -a * s.clamp(1 - low, 1 + high)).mean(), s


def _batch(old, adv, mask) -> TokenBatch:
    return TokenBatch(
        input_ids=torch.zeros(B, T, dtype=torch.long),
        attention_mask=torch.ones(B, T),
        response_mask=mask,
        rollout_logp=old,
        advantages=adv,
    )


def _ours(logp, old, adv, mask, low, high, alg_text: str = ""):
    cfg = load_config_text(f"[algorithm.loss]\nname = 'gspo'\nclip_low = {low}\nclip_high = {high}\n{alg_text}")
    loss_fn = build(cfg.algorithm)
    mb = _batch(old, adv, mask)
    return loss_fn(ForwardOutput(logp=logp), mb, LossContext(num_tokens=float(mask.sum()), num_seqs=float(B)))


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("spread", "low", "high"), [(0.01, 3e-4, 4e-4), (0.3, 0.2, 0.28), (1e-5, 3e-4, 4e-4)])
def test_the_token_form_has_the_value_and_gradient_of_the_papers_sequence_objective(spread, low, high):
    logp, old, adv, mask = _inputs(0, spread)
    loss, metrics = _ours(logp, old, adv, mask, low, high)
    (grad,) = torch.autograd.grad(loss, logp)
    ref_logp = logp.detach().clone().requires_grad_(True)
    ref, s = _paper(ref_logp, old, adv, mask, low, high)
    (ref_grad,) = torch.autograd.grad(ref, ref_logp)
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-8)
    assert grad[mask == 0].abs().max() == 0  # no gradient on padding
    clipped = ((s < 1 - low) & (adv[:, 0] < 0)) | ((s > 1 + high) & (adv[:, 0] > 0))
    assert metrics["clip_frac"] == pytest.approx(float((clipped[:, None] * mask).sum() / mask.sum()), abs=1e-6)


@pytest.mark.timeout(30)
def test_a_response_is_clipped_whole_or_not_at_all():
    logp, old, adv, mask = _inputs(1, 0.05)
    _, metrics = _ours(logp, old, adv, mask, 3e-4, 4e-4)
    from asyncflow.algorithms.gspo import gspo_token_loss

    _, clipped = gspo_token_loss(logp.detach(), old, adv, mask, 3e-4, 4e-4)
    per_seq = [set(clipped[b][mask[b] > 0].tolist()) for b in range(B)]
    assert all(len(values) == 1 for values in per_seq), per_seq
    assert 0 < metrics["clip_frac"] < 1  # these tensors clip some responses and keep others


@pytest.mark.timeout(30)
def test_a_response_whose_policy_moved_far_is_held_and_stays_finite():
    logp, old, adv, mask = _inputs(2, 0.01)
    with torch.no_grad():
        logp[0] += 50.0  # mean log-ratio 50: exp would overflow float32
    loss, _ = _ours(logp, old, adv, mask, 3e-4, 4e-4)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()


@pytest.mark.timeout(30)
def test_the_kl_and_entropy_terms_of_algorithm_apply_as_to_ppo_clip():
    logp, old, adv, mask = _inputs(3, 0.01)
    plain, _ = _ours(logp, old, adv, mask, 3e-4, 4e-4)
    ent = torch.rand(B, T)
    cfg = load_config_text("[algorithm]\nentropy_coef = 0.1\n[algorithm.loss]\nname = 'gspo'\n")
    mb = _batch(old, adv, mask)
    ctx = LossContext(num_tokens=float(mask.sum()), num_seqs=float(B))
    with_bonus, metrics = build(cfg.algorithm)(ForwardOutput(logp=logp, entropy=ent), mb, ctx)
    bonus = ((-0.1 * ent * mask).sum(1) / mask.sum(1)).mean()  # seq-mean-token-mean of the entropy bonus
    torch.testing.assert_close(with_bonus, plain + bonus, rtol=1e-5, atol=1e-7)
    assert metrics["entropy"] == pytest.approx(float((ent * mask).sum() / mask.sum()), rel=1e-5)


@pytest.mark.timeout(30)
def test_the_config_selects_gspo_by_name_and_refuses_a_key_of_another_loss():
    cfg = load_config_text("[algorithm.loss]\nname = 'gspo'\n")
    assert isinstance(cfg.algorithm.loss, GSPOLoss) and registry.loss_name(cfg.algorithm.loss) == "gspo"
    assert registry.resolve(registry.policy_loss("gspo").build) is build
    with pytest.raises(ConfigError, match="dual_clip: unknown key"):
        load_config_text("[algorithm.loss]\nname = 'gspo'\ndual_clip = 3.0\n")
    with pytest.raises(ConfigError, match="use one of 'ppo_clip', 'gspo'"):
        load_config_text("[algorithm.loss]\nname = 'gsp'\n")
    assert msgspec.json.decode(msgspec.json.encode(cfg.algorithm.loss), type=registry.LossConfig) == cfg.algorithm.loss
