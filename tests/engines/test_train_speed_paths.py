"""The trainer's faster paths learn what the plain one does: micro-batches sized by
tokens (``train.engine.micro_batch_tokens``: rows sorted by length, each micro-batch
trimmed to its longest row) and log-probs and entropies taken chunk by chunk from the
LM head without the whole float32 log-softmax (``train.engine.logit_chunk``). On a tiny
model in float32, their log-probs, entropies, loss and gradients equal the plain path's
within float rounding."""

from __future__ import annotations

import pytest
import torch

from asyncflow.config.load import ConfigError, load_config_text
from asyncflow.engines.base import LossContext, TokenBatch
from asyncflow.engines.config import TrainEngineConfig
from asyncflow.engines.factory import build_train_engine


def ragged_batch(vocab: int, seed: int = 0) -> TokenBatch:
    """Nine right-padded rows of 3 to 17 tokens in shuffled order, prompts of 2 to 5 tokens,
    one masked token inside a response, per-row advantages and rollout log-probs."""
    g = torch.Generator().manual_seed(seed)
    lengths = [17, 4, 9, 3, 12, 6, 15, 5, 8]
    prompts = [2, 3, 5, 2, 4, 3, 5, 2, 3]
    T = max(lengths)
    ids = torch.zeros(len(lengths), T, dtype=torch.int64)
    attn = torch.zeros(len(lengths), T, dtype=torch.int64)
    resp = torch.zeros(len(lengths), T)
    for b, (n, p) in enumerate(zip(lengths, prompts)):
        ids[b, :n] = torch.randint(3, vocab, (n,), generator=g)
        attn[b, :n] = 1
        resp[b, p:n] = 1.0
    resp[4, 6] = 0.0
    adv = torch.randn(len(lengths), 1, generator=g).expand(-1, T) * resp
    return TokenBatch(
        input_ids=ids, attention_mask=attn, response_mask=resp, advantages=adv.contiguous(), rollout_logp=-2.0 * resp
    )


def pg_entropy_loss(out, mb, ctx):
    """A policy-gradient term and an entropy bonus: gradients flow through both outputs."""
    ratio = torch.exp(out.logp - mb.rollout_logp) * mb.response_mask
    loss = (-(ratio * mb.advantages) - 0.1 * out.entropy * mb.response_mask).sum() / ctx.num_tokens
    return loss, {"tokens": float(mb.response_mask.sum())}


def grads(engine, batch: TokenBatch, temperature: float) -> tuple[float, dict[str, torch.Tensor]]:
    mask = batch.response_mask
    ctx = LossContext(num_tokens=float(mask.sum()), num_seqs=float((mask.sum(1) > 0).sum()), dp_size=1)
    part = engine.accumulate(batch, pg_entropy_loss, ctx, temperature)
    out = {n: p.grad.clone() for n, p in engine.net.named_parameters() if p.grad is not None}
    engine.optimizer.zero_grad(set_to_none=True)
    return part.loss, out


def assert_same_learning(plain, fast, batch: TokenBatch, temperature: float) -> None:
    on = batch.response_mask > 0  # what losses read (before it, where logits start depends on the micro-batch)
    want, got = plain.forward(batch, temperature, with_entropy=True), fast.forward(batch, temperature, with_entropy=True)
    assert torch.allclose(got.logp[on], want.logp[on], atol=1e-5)
    assert torch.allclose(got.entropy[on], want.entropy[on], atol=1e-5)
    assert (want.logp[on] != 0).all()
    want_loss, want_g = grads(plain, batch, temperature)
    got_loss, got_g = grads(fast, batch, temperature)
    assert got_loss == pytest.approx(want_loss, abs=1e-6)
    assert set(got_g) == set(want_g) and len(want_g) > 0
    for name, g in want_g.items():
        assert torch.allclose(got_g[name], g, atol=1e-6, rtol=1e-4), name
    assert any(float(g.abs().max()) > 1e-4 for g in want_g.values())  # gradients that could differ


@pytest.mark.timeout(120)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_chunked_logits_give_the_plain_paths_logprobs_entropies_loss_and_gradients(arch, llama_dir, qwen2_dir):
    model_dir = llama_dir if arch == "llama" else qwen2_dir
    plain = build_train_engine(TrainEngineConfig(lr=1e-3, micro_batch_size=4, logit_chunk=0), model_dir)
    fast = build_train_engine(TrainEngineConfig(lr=1e-3, micro_batch_size=4, logit_chunk=5), model_dir)
    assert fast._chunk_head is not None and plain._chunk_head is None  # the paths compared are the two
    for temperature in (1.0, 0.7):
        assert_same_learning(plain, fast, ragged_batch(vocab=90), temperature)


@pytest.mark.timeout(120)
def test_token_sized_micro_batches_learn_what_row_micro_batches_do_with_less_padding(llama_dir):
    plain = build_train_engine(TrainEngineConfig(lr=1e-3, micro_batch_size=3, logit_chunk=0), llama_dir)
    fast = build_train_engine(TrainEngineConfig(lr=1e-3, micro_batch_tokens=40, logit_chunk=0), llama_dir)
    batch = ragged_batch(vocab=90, seed=1)
    assert_same_learning(plain, fast, batch, 1.0)
    mbs = fast._micro_batches(batch)
    fed = sum(mb.batch.input_ids.numel() for mb in mbs)
    assert all(mb.batch.input_ids.numel() <= 40 for mb in mbs if len(mb.batch.input_ids) > 1)
    assert sorted(b for mb in mbs for b in mb.rows) == list(range(batch.batch_size))
    assert fed < sum(mb.batch.input_ids.numel() for mb in plain._micro_batches(batch))
    lone = build_train_engine(TrainEngineConfig(lr=1e-3, micro_batch_tokens=10, logit_chunk=0), llama_dir)
    assert [len(mb.batch.input_ids) for mb in lone._micro_batches(batch)][-1] == 1  # the longest row alone


@pytest.mark.timeout(120)
@pytest.mark.parametrize("packing", [False, True])
def test_under_bfloat16_autocast_the_chunked_head_runs_in_float32_as_the_whole_one(packing, qwen2_dir):
    """Both heads take the same bfloat16 decoder's hidden states in float32: their log-probs
    agree to float rounding, far closer than a bfloat16 head's ~0.1."""
    cfg = {"micro_batch_size": 4, "autocast": "bfloat16", "packing": packing}
    plain = build_train_engine(TrainEngineConfig(logit_chunk=0, **cfg), qwen2_dir)
    fast = build_train_engine(TrainEngineConfig(logit_chunk=7, **cfg), qwen2_dir)
    batch = ragged_batch(vocab=90, seed=2)
    on = batch.response_mask > 0
    want, got = plain.forward(batch, with_entropy=True), fast.forward(batch, with_entropy=True)
    assert float((got.logp - want.logp)[on].abs().max()) < 1e-4
    assert float((got.entropy - want.entropy)[on].abs().max()) < 1e-4


@pytest.mark.timeout(120)
@pytest.mark.parametrize("packing", [False, True])
def test_eager_attention_learns_what_sdpa_does(packing, llama_dir):
    cfg = {"micro_batch_size": 4, "packing": packing, "logit_chunk": 0}
    sdpa = build_train_engine(TrainEngineConfig(lr=1e-3, attention="sdpa", **cfg), llama_dir)
    eager = build_train_engine(TrainEngineConfig(lr=1e-3, attention="eager", **cfg), llama_dir)
    assert_same_learning(sdpa, eager, ragged_batch(vocab=90, seed=3), 1.0)
    assert sdpa.net.lm.config._attn_implementation == "sdpa" and eager.net.lm.config._attn_implementation == "eager"


def test_auto_attention_is_eager_on_the_cpu_for_short_rows_only(llama_dir):
    engine = build_train_engine(TrainEngineConfig(lr=1e-3), llama_dir)
    engine._set_attention(62)
    assert engine.net.lm.config._attn_implementation == "eager"
    engine._set_attention(257)  # eager's [rows, heads, T, T] scores grow with the square of the length
    assert engine.net.lm.config._attn_implementation == "sdpa"


def test_micro_batch_tokens_with_packing_or_fsdp_is_refused_by_name():
    for other in ("packing = true", "fsdp = true"):
        with pytest.raises(ConfigError, match="micro_batch_tokens = 0"):
            load_config_text(f"[train.engine]\nmicro_batch_tokens = 4096\n{other}\n")
