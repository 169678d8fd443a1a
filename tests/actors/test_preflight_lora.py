"""The memory check before launch with LoRA: the trainer holds every weight but
gradients and AdamW moments only for the adapters, and stages only them for a sync."""

from __future__ import annotations

import json

import pytest

from asyncflow.actors.driver.preflight import estimate
from asyncflow.config.load import load_config_text

H, L, V, INTER, KV_DIM = 64, 2, 100, 256, 32  # 8 heads of 8, 4 KV heads


@pytest.fixture
def model(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": H,
                "intermediate_size": INTER,
                "num_hidden_layers": L,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "vocab_size": V,
                "tie_word_embeddings": False,
            }
        )
    )
    return str(tmp_path)


def _params() -> int:
    """The full model, counted by hand: q/o (with q bias), k/v (with biases), SwiGLU, two norms a layer;
    embeddings, head, final norm."""
    layer = (H * H + H) + 2 * (H * KV_DIM + KV_DIM) + H * H + 3 * H * INTER + 2 * H
    return L * layer + 2 * V * H + H


def _cfg(lora: str = "", extra: str = ""):
    return load_config_text(f"{extra}\n[rollout.engine]\nkv_cache_bytes = 1000\n[train.engine.lora]\n{lora}")


def test_lora_counts_weights_of_all_but_gradients_and_moments_of_the_adapters_only(model):
    P = _params()
    A = L * 8 * ((H + H) + 2 * (H + KV_DIM) + (H + H))  # rank 8 on q, k, v, o: r x (in + out) each
    adapted = L * (H * H + 2 * H * KV_DIM + H * H)  # the weights a native replica keeps a base copy of
    full, lora = estimate(_cfg(), model), estimate(_cfg("rank = 8"), model)
    b = 4  # float32, the default train and rollout dtype
    assert full["trainer"] == 4 * P * b + 4 * P  # weights, grads, 2 moments + the staged snapshot
    assert lora["trainer"] == (P + A) * b + 3 * A * b + 4 * A
    assert full["trainer"] - lora["trainer"] == 3 * P * b - 4 * A * b + 4 * (P - A)
    assert full["rollout.0"] == P * b + 1000 + 4 * P
    assert lora["rollout.0"] == P * b + 1000 + 4 * A + adapted * b
    norms = (2 * L + 1) * H
    with_norms = estimate(_cfg("rank = 8\ntrain_norms = true"), model)
    assert with_norms["trainer"] == (P + A) * b + 3 * (A + norms) * b + 4 * (A + norms)


def test_a_ppo_critic_trains_in_full_beside_a_lora_policy_and_ranks_shard_the_state(model):
    P = _params()
    A = L * 8 * ((H + H) + 2 * (H + KV_DIM) + (H + H))
    ppo = estimate(_cfg("rank = 8", '[algorithm]\nname = "ppo"'), model)
    assert ppo["trainer"] == (P + A) * 4 + 3 * A * 4 + 4 * P * 4 + 4 * A
    dp = estimate(_cfg("rank = 8", "[train]\nnum_ranks = 2\n[train.engine]\nfsdp = true"), model)
    assert dp["trainer.1"] == ((P + A) * 4 + 3 * A * 4) / 2


def test_without_lora_the_estimate_is_unchanged_whatever_the_other_lora_keys_say(model):
    off = 'rank = 0\ntrain_norms = true\ntarget_modules = ["q_proj", "gate_proj", "down_proj"]'
    for extra in ("", '[algorithm]\nname = "ppo"', "[train]\nnum_ranks = 2\n[train.engine]\nfsdp = true"):
        assert estimate(_cfg(off, extra), model) == estimate(_cfg("", extra), model)
    P = _params()
    assert estimate(_cfg(), model)["trainer"] == P * 4 * 4 + P * 4  # the formula before LoRA was counted
