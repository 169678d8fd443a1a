"""``train.engine.share_prompts``: each distinct prompt of a micro-batch runs once and
every row's response on its keys and values (engines/shared_prompts.py). The log-probs,
entropies and gradients must be the padded path's, up to float rounding, on a tiny
model of each architecture and at a real model's size."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from asyncflow.config.load import ConfigError, load_config_text
from asyncflow.engines.base import LossContext, TokenBatch
from asyncflow.engines.config import TrainEngineConfig
from asyncflow.engines.factory import build_train_engine
from asyncflow.engines.shared_prompts import plan_shared

sys.path.insert(0, os.path.dirname(__file__))
from real_sizes import REAL_SHAPES, real_size_model  # noqa: E402


def grouped_batch(vocab: int, seed: int = 0) -> TokenBatch:
    """Three prompts (5, 8 and 3 tokens) held by 3, 1 and 2 rows, interleaved; responses of
    2 to 6 tokens, right-padded to the longest row, one response with a masked token inside
    (a tool's output in a multi-turn sample) and per-row advantages."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 8, 3)]
    rows = [(0, 6), (1, 4), (0, 2), (2, 5), (0, 6), (2, 3)]  # (prompt, response length)
    T = max(len(prompts[p]) + n for p, n in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.int64)
    attn = torch.zeros(len(rows), T, dtype=torch.int64)
    resp = torch.zeros(len(rows), T)
    for b, (p, n) in enumerate(rows):
        seq = prompts[p] + torch.randint(3, vocab, (n,), generator=g).tolist()
        ids[b, : len(seq)] = torch.tensor(seq)
        attn[b, : len(seq)] = 1
        resp[b, len(prompts[p]) : len(seq)] = 1.0
    resp[3, len(prompts[2]) + 2] = 0.0  # not trained on, but attended to
    adv = torch.randn(len(rows), 1, generator=g).expand(-1, T) * resp
    return TokenBatch(input_ids=ids, attention_mask=attn, response_mask=resp, advantages=adv.contiguous())


def pg_loss(out, mb, ctx):
    loss = -(out.logp * mb.advantages * mb.response_mask).sum() / ctx.num_tokens
    return loss, {}


def both(model_dir, **cfg) -> tuple:
    return tuple(build_train_engine(TrainEngineConfig(lr=1e-3, share_prompts=on, **cfg), model_dir) for on in (False, True))


def grads(engine, batch: TokenBatch) -> dict[str, torch.Tensor]:
    mask = batch.response_mask
    ctx = LossContext(num_tokens=float(mask.sum()), num_seqs=float((mask.sum(1) > 0).sum()), dp_size=1)
    engine.accumulate(batch, pg_loss, ctx)
    out = {n: p.grad.clone() for n, p in engine.net.named_parameters() if p.grad is not None}
    engine.optimizer.zero_grad(set_to_none=True)
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_shared_prompts_give_the_padded_paths_logprobs_entropies_and_gradients(arch, qwen2_dir, llama_dir):
    model_dir = qwen2_dir if arch == "qwen2" else llama_dir
    padded, shared = both(model_dir, micro_batch_size=8)
    b = grouped_batch(vocab=90)
    plan = plan_shared(b)
    assert plan is not None and plan.prompt_GP.shape[0] == 3 and plan.group_B.tolist() == [0, 1, 0, 2, 0, 2]
    want, got = padded.forward(b, with_entropy=True), shared.forward(b, with_entropy=True)
    # on the response parts (what losses read); the padded path also computes earlier positions
    part = torch.zeros_like(b.response_mask, dtype=torch.bool)
    for r, (start, length) in enumerate(zip(plan.prompt_len_B.tolist(), b.attention_mask.sum(1).tolist())):
        part[r, start:length] = True
    assert torch.allclose(got.logp[part], want.logp[part], atol=1e-5) and (got.logp[~part] == 0).all()
    assert torch.allclose(got.entropy[part], want.entropy[part], atol=1e-5) and (got.entropy[~part] == 0).all()
    assert (want.logp[part] != 0).all()  # every response token has a log-prob to compare
    want_g, got_g = grads(padded, b), grads(shared, b)
    assert set(got_g) == set(want_g) and len(want_g) > 0
    for name, g in want_g.items():
        assert torch.allclose(got_g[name], g, atol=1e-6, rtol=1e-4), name
    assert any(float(g.abs().max()) > 1e-4 for g in want_g.values())  # gradients that could differ


@pytest.mark.timeout(120)
def test_shared_prompts_under_bfloat16_autocast_stay_within_its_rounding_and_micro_batches_split_groups(qwen2_dir):
    padded, shared = both(qwen2_dir, micro_batch_size=4, autocast="bfloat16")  # a group split across micro-batches
    b = grouped_batch(vocab=90, seed=1)
    on = b.response_mask > 0
    gap = (shared.forward(b).logp - padded.forward(b).logp)[on].abs().max()
    assert float(gap) < 0.05


def test_a_batch_that_shares_nothing_or_cannot_keeps_the_padded_path():
    b = grouped_batch(vocab=90)
    assert plan_shared(b.select([0, 1, 3])) is None  # every prompt distinct
    no_response = grouped_batch(vocab=90)
    no_response.response_mask[2] = 0.0
    assert plan_shared(no_response) is None
    holes = grouped_batch(vocab=90)
    holes.attention_mask[0, 1] = 0  # not right-padded
    assert plan_shared(holes) is None


def test_share_prompts_with_packing_or_fsdp_is_refused_by_name():
    for other in ("packing = true", "fsdp = true", "gradient_checkpointing = true"):
        with pytest.raises(ConfigError, match="share_prompts"):
            load_config_text(f"[train.engine]\nshare_prompts = true\n{other}\n")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["qwen", pytest.param("llama", marks=pytest.mark.slow)])
def test_shared_prompts_at_a_real_models_size_give_the_padded_paths_logprobs_and_embedding_gradient(kind, tmp_path_factory):
    """Qwen2.5-0.5B's embedding (136 M elements, tied) or Llama-3.2-1B's (untied head):
    the head's and the embedding's gradients pass 2^24 elements."""
    model_dir = real_size_model(kind, tmp_path_factory)
    padded, shared = both(model_dir, micro_batch_size=8)
    b = grouped_batch(vocab=REAL_SHAPES[kind]["vocab_size"], seed=2)
    assert int(b.input_ids.max()) > 2**16
    on = b.response_mask > 0
    assert torch.allclose(shared.forward(b).logp[on], padded.forward(b).logp[on], atol=1e-4)
    want_g, got_g = grads(padded, b), grads(shared, b)
    names = [n for n in want_g if "embed_tokens" in n or "lm_head" in n]
    assert names and all(want_g[n].numel() > 2**24 for n in names)
    for name in names:
        assert torch.allclose(got_g[name], want_g[name], atol=1e-6, rtol=1e-3), name
