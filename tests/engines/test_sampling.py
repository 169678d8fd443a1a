"""The sampler draws tokens with the probabilities it is given, and never one that
top-k or top-p cut."""

import pytest
import torch

from asyncflow.engines.config import SamplingParams
from asyncflow.engines.sampling import draw, sample


@pytest.mark.timeout(30)
def test_draws_follow_the_given_probabilities_and_never_pick_a_zero_one():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    rows = probs.repeat(40_000, 1) * 3.0  # unnormalised rows are normalised
    token = draw(rows, torch.Generator().manual_seed(0))
    freq = torch.bincount(token, minlength=6).double() / len(token)
    assert set(token.unique().tolist()) == {1, 3, 4}
    assert torch.allclose(freq, probs.double(), atol=0.01)  # 40k draws: one standard deviation is 0.0025


@pytest.mark.timeout(30)
def test_top_k_and_top_p_cut_tokens_are_never_sampled_and_the_logprob_is_the_untruncated_one():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.06, 0.04]])).repeat(5_000, 1)
    gen = torch.Generator().manual_seed(1)
    token, logp = sample(logits, SamplingParams(temperature=1.0, top_k=2), gen)
    assert set(token.unique().tolist()) == {0, 1}
    assert torch.allclose(logp, torch.log_softmax(logits, -1).gather(1, token.unsqueeze(1)).squeeze(1))
    token, _ = sample(logits, SamplingParams(temperature=1.0, top_p=0.85), gen)
    assert set(token.unique().tolist()) == {0, 1, 2}  # 0.4 + 0.3 < 0.85: the third is kept, the rest cut
