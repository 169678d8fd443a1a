"""The sampler draws tokens with the probabilities it is given, and never one that
top-k or top-p cut."""

import pytest
import torch

from asyncflow.engines.config import SamplingParams
from asyncflow.engines.sampling import draw, keep_mask, sample, truncated_logits


@pytest.mark.timeout(30)
def test_draws_follow_the_given_probabilities_and_never_pick_a_zero_one():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    rows = probs.repeat(40_000, 1) * 3.0  # unnormalised rows are normalised
    token = draw(rows, torch.Generator().manual_seed(0))
    freq = torch.bincount(token, minlength=6).double() / len(token)
    assert set(token.unique().tolist()) == {1, 3, 4}
    assert torch.allclose(freq, probs.double(), atol=0.01)  # 40k draws: one standard deviation is 0.0025


@pytest.mark.timeout(30)
def test_top_k_and_top_p_cut_tokens_are_never_sampled_and_the_logprob_is_that_of_the_truncated_distribution():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.06, 0.04])
    logits = torch.log(probs).unsqueeze(0).repeat(5_000, 1)
    gen = torch.Generator().manual_seed(1)
    token, logp = sample(logits, SamplingParams(temperature=1.0, top_k=2), gen)
    assert set(token.unique().tolist()) == {0, 1}
    kept = probs[:2] / probs[:2].sum()  # what the token was drawn from: 4/7 and 3/7
    assert torch.allclose(logp, kept.log()[token])
    token, logp = sample(logits, SamplingParams(temperature=1.0, top_p=0.85), gen)
    assert set(token.unique().tolist()) == {0, 1, 2}  # 0.4 + 0.3 < 0.85: the third is kept, the rest cut
    assert torch.allclose(logp, (probs[:3] / probs[:3].sum()).log()[token])


@pytest.mark.timeout(30)
def test_top_p_applies_to_what_top_k_left_and_the_logprob_sums_to_one_over_the_kept_tokens():
    """vLLM's order: top-k first, then top-p of the renormalised top-k mass; the recorded
    log-probs of the kept set are a distribution (their exps sum to 1)."""
    probs = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1])
    logits = torch.log(probs).unsqueeze(0)
    keep = keep_mask(logits, top_k=3, top_p=0.6)
    # top-3: 0.3/0.75 = 0.4, 0.25/0.75 = 0.33 (0.4 < 0.6: kept), 0.2/0.75 (0.73 >= 0.6 before it? no: 0.73 reached after)
    assert keep.tolist() == [[True, True, False, False, False]]
    cut = truncated_logits(logits, top_k=3, top_p=0.6)
    assert torch.log_softmax(cut, -1).exp().sum().item() == pytest.approx(1.0)
    assert torch.isinf(cut[0, 2:]).all()
    # a token the other side drew is kept even where this side's numbers cut it (the trainer's rounding)
    assert torch.isfinite(truncated_logits(logits, 3, 0.6, token_B=torch.tensor([2]))[0, 2])


@pytest.mark.timeout(60)
def test_the_trainers_truncated_logprobs_are_the_samplers_whatever_the_chunking(monkeypatch):
    """``shift_logp`` finds the kept sets chunk by chunk (memory over a real vocabulary):
    the chunking changes nothing, and every log-prob is that of ``sample``'s rule."""
    from asyncflow.engines import torch_train

    gen = torch.Generator().manual_seed(3)
    logits_BTV = torch.randn(2, 65, 151_936, generator=gen) * 3  # Qwen2.5's vocabulary
    ids_BT = torch.randint(0, 151_936, (2, 65), generator=gen)
    ids_BT[:, 1:] = logits_BTV[:, :-1].argmax(-1)  # drawn tokens: in the kept set
    whole = torch_train.shift_logp(logits_BTV, ids_BT, 0.8, top_k=50, top_p=0.9)
    monkeypatch.setattr(torch_train, "TRUNCATE_CHUNK", 23)
    chunked = torch_train.shift_logp(logits_BTV, ids_BT, 0.8, top_k=50, top_p=0.9)
    assert torch.equal(whole, chunked)
    rule = torch.log_softmax(truncated_logits(logits_BTV[0, :-1] / 0.8, 50, 0.9), -1)
    assert torch.allclose(whole[0, 1:], rule.gather(1, ids_BT[0, 1:, None]).squeeze(1), atol=1e-5)
