"""LoRA in the engines: adapters train, only they travel, a replica merges them onto
its base (replacing, never accumulating), the digests agree, and checkpoints are
peft's layout."""

import os
import sys

import msgspec
import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncflow.engines.config import LoraConfig, RolloutEngineConfig, TrainEngineConfig
from asyncflow.engines.factory import build_rollout_engine, build_train_engine
from asyncflow.engines.lora import ADAPTER_DIR, merge, split

sys.path.insert(0, os.path.dirname(__file__))
from test_torch_train import batch, nll  # noqa: E402

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def lora_cfg(rank: int = 4, **kw) -> TrainEngineConfig:
    return TrainEngineConfig(lr=1e-2, micro_batch_size=2, lora=LoraConfig(rank=rank, alpha=8.0, target_modules=ATTN, **kw))


def nbytes(named) -> int:
    return sum(t.numel() * t.element_size() for _, t in named)


RESPONSE = 5
"""``batch()``'s responses start at column 5: the trainer computes log-probs from there on (``logits_start``)."""


def hf_logp(model, b) -> torch.Tensor:
    """Log-probs of ``b``'s row 1 under a plain transformers forward, at its response tokens."""
    logits = model(input_ids=b.input_ids[1:2]).logits[0, :-1]
    return torch.log_softmax(logits.float(), -1).gather(1, b.input_ids[1, 1:, None]).squeeze(1)[RESPONSE - 1 :]


def trained(model_dir, steps: int = 3, **kw):
    engine = build_train_engine(lora_cfg(**kw), model_dir)
    for _ in range(steps):
        engine.train_step(batch(), nll)
    return engine


def test_lora_trains_only_the_adapters_and_leaves_the_base_weights_frozen(qwen2_dir):
    engine = trained(qwen2_dir)
    base = AutoModelForCausalLM.from_pretrained(qwen2_dir)
    before = dict(base.named_parameters())
    for name, param in engine.net.lm.named_parameters():
        if ".lora_" in name:
            assert param.requires_grad
        else:
            assert not param.requires_grad
            assert torch.equal(param, before[name.replace(".base_layer.", ".")]), name
    assert all(".lora_" in n for n, p in engine.net.named_parameters() if p.requires_grad)
    # B starts at zero: three steps moved it, so the policy differs from the base
    assert not torch.allclose(engine.forward(batch()).logp[1, RESPONSE:], hf_logp(base, batch()), atol=1e-3)


def test_a_sync_carries_only_the_adapters_at_least_ten_times_fewer_bytes(qwen2_dir):
    full = build_train_engine(TrainEngineConfig(), qwen2_dir)
    engine = trained(qwen2_dir, steps=1)
    snapshot = list(engine.export_weights())
    names = [n for n, _ in snapshot]
    assert all(n.endswith((".lora_A.weight", ".lora_B.weight", ".lora_scaling")) for n in names)
    assert len(names) == 3 * 4 * engine.net.lm.config.num_hidden_layers
    assert nbytes(full.export_weights()) >= 10 * nbytes(snapshot)


def test_the_replica_merges_the_adapters_and_generates_with_the_trainers_policy_and_digest(qwen2_dir):
    engine = trained(qwen2_dir)
    rollout = build_rollout_engine(RolloutEngineConfig(), qwen2_dir)
    base_digest = rollout.weights_digest()
    snapshot = list(engine.export_weights())
    rollout.load_weights(snapshot, version=3)
    b = batch()
    assert torch.allclose(hf_logp(rollout.model, b), engine.forward(b).logp[1, RESPONSE:], atol=1e-4)
    assert rollout.weights_digest() == engine.published_digest(snapshot, torch.float32)
    assert rollout.weights_digest() != base_digest
    # a fresh LoRA engine (B = 0) publishes the base weights' digest: version 0 checks out
    fresh = build_train_engine(lora_cfg(), qwen2_dir)
    assert fresh.published_digest(list(fresh.export_weights()), torch.float32) == base_digest


def test_a_new_adapter_replaces_the_previous_one_instead_of_accumulating(qwen2_dir):
    engine = build_train_engine(lora_cfg(), qwen2_dir)
    rollout = build_rollout_engine(RolloutEngineConfig(), qwen2_dir)
    engine.train_step(batch(), nll)
    rollout.load_weights(list(engine.export_weights()), version=1)
    engine.train_step(batch(), nll)
    second = list(engine.export_weights())
    rollout.load_weights(second, version=2)
    once = build_rollout_engine(RolloutEngineConfig(), qwen2_dir)
    once.load_weights(second, version=2)
    for name, param in rollout.model.named_parameters():
        assert torch.equal(param, dict(once.model.named_parameters())[name]), name
    assert rollout.weights_digest() == engine.published_digest(second, torch.float32)


def test_the_digest_of_merged_bfloat16_weights_matches_the_trainers_prediction(qwen2_dir):
    engine = trained(qwen2_dir, steps=2)
    rollout = build_rollout_engine(RolloutEngineConfig(dtype="bfloat16"), qwen2_dir)
    snapshot = list(engine.export_weights())
    rollout.load_weights(snapshot, version=2)
    assert rollout.weights_digest() == engine.published_digest(snapshot, torch.bfloat16)


def test_merge_adds_scaling_times_B_at_A_to_the_base():
    g = torch.Generator().manual_seed(0)
    base, A, B = torch.randn(6, 5, generator=g), torch.randn(3, 5, generator=g), torch.randn(6, 3, generator=g)
    _, adapters = split([("m.lora_A.weight", A), ("m.lora_B.weight", B), ("m.lora_scaling", torch.tensor(0.5))])
    assert torch.allclose(merge(base, adapters["m"], torch.float32), base + 0.5 * B @ A, atol=1e-6)
    with pytest.raises(ValueError, match="lora_scaling"):
        split([("m.lora_A.weight", A), ("m.lora_B.weight", B)])


def test_a_checkpoint_is_peft_layout_loadable_by_peft_with_a_merged_model_and_resumes(qwen2_dir, tmp_path):
    from peft import PeftModel

    engine = trained(qwen2_dir, save_merged=True)
    engine.save_checkpoint(tmp_path / "ckpt")
    adapter = tmp_path / "ckpt" / ADAPTER_DIR
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    b = batch(seed=2)
    want = engine.forward(b).logp[1, RESPONSE:]
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(qwen2_dir), str(adapter))
    assert torch.allclose(hf_logp(peft_model, b), want, atol=1e-4)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "merged")
    assert torch.allclose(hf_logp(merged, b), want, atol=1e-4)
    # resume: the trainer continues from the adapter and its optimizer state; a replica started on the
    # checkpoint merges its adapter and holds the digest the resumed trainer publishes
    resumed = build_train_engine(lora_cfg(save_merged=True), tmp_path / "ckpt")
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.version == 3
    assert torch.allclose(resumed.forward(b).logp, engine.forward(b).logp, atol=1e-6)
    snapshot = list(resumed.export_weights())
    replica = build_rollout_engine(RolloutEngineConfig(), tmp_path / "ckpt")
    assert replica.weights_digest() == resumed.published_digest(snapshot, torch.float32)
    assert resumed.train_step(batch(), nll).loss == pytest.approx(engine.train_step(batch(), nll).loss, abs=1e-5)


def test_a_lora_checkpoint_refuses_to_resume_without_lora_and_back(qwen2_dir, tmp_path):
    build_train_engine(TrainEngineConfig(), qwen2_dir).save_checkpoint(tmp_path / "plain")
    with pytest.raises(FileNotFoundError, match="not a LoRA checkpoint"):
        build_train_engine(lora_cfg(), qwen2_dir).load_checkpoint(tmp_path / "plain")


def test_lora_off_keeps_the_full_weight_export_and_every_weight_training(qwen2_dir):
    engine = build_train_engine(TrainEngineConfig(lr=1e-2, micro_batch_size=2), qwen2_dir)
    assert not engine.lora
    engine.train_step(batch(), nll)
    snapshot = list(engine.export_weights())
    assert [n for n, _ in snapshot] == [n for n, _ in engine.net.lm.named_parameters()]
    assert all(p.requires_grad for p in engine.net.parameters())


def test_the_best_checkpoint_of_a_lora_run_holds_base_and_adapter_and_loads_as_the_policy(qwen2_dir, tmp_path):
    from asyncflow.actors.evaluation.evaluator import save_best

    engine = trained(qwen2_dir)
    snapshot = list(engine.export_weights())
    path = save_best(tmp_path, snapshot, qwen2_dir, 2, {"val/accuracy": 0.5, "val/reward_mean": 0.5})
    assert (path / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    replica = build_rollout_engine(RolloutEngineConfig(), path)
    assert replica.weights_digest() == engine.published_digest(snapshot, torch.float32)


def test_lora_with_gradient_checkpointing_takes_the_same_step(qwen2_dir):
    plain = build_train_engine(lora_cfg(), qwen2_dir)
    checkpointed = build_train_engine(msgspec.structs.replace(lora_cfg(), gradient_checkpointing=True), qwen2_dir)
    a, b = plain.train_step(batch(), nll), checkpointed.train_step(batch(), nll)
    assert b.grad_norm > 0 and b.grad_norm == pytest.approx(a.grad_norm, rel=1e-4)
    for (name, x), (_, y) in zip(plain.export_weights(), checkpointed.export_weights()):
        assert torch.allclose(x, y, atol=1e-6), name


def test_train_norms_trains_and_syncs_the_norm_weights_in_full_and_the_replica_matches(qwen2_dir):
    engine = trained(qwen2_dir, train_norms=True)
    snapshot = list(engine.export_weights())
    norms = [n for n, _ in snapshot if not n.endswith((".lora_A.weight", ".lora_B.weight", ".lora_scaling"))]
    assert norms and all(n.endswith("norm.weight") for n in norms)
    base = dict(AutoModelForCausalLM.from_pretrained(qwen2_dir).named_parameters())
    assert any(not torch.equal(t, base[n]) for n, t in snapshot if n in norms)  # they trained
    rollout = build_rollout_engine(RolloutEngineConfig(), qwen2_dir)
    rollout.load_weights(snapshot, version=3)
    b = batch()
    assert torch.allclose(hf_logp(rollout.model, b), engine.forward(b).logp[1, RESPONSE:], atol=1e-4)
    assert rollout.weights_digest() == engine.published_digest(snapshot, torch.float32)
    off = trained(qwen2_dir)  # train_norms off: the norms stay frozen and never travel
    assert all(".lora_" in n for n, _ in off.export_weights())
