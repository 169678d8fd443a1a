"""Any causal LM trains: tiny random models of families other than Qwen2/Llama (their own
head layouts: an explicit head_dim, q/k norms, fused projections, mixtures of experts, no
``.model`` attribute), built with transformers' own config classes, load into the training
engine, take a step and save a checkpoint transformers loads back with the same weights."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma3Config,
    Gemma3TextConfig,
    GPT2Config,
    MixtralConfig,
    Olmo2Config,
    Phi3Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

from asyncflow.engines.config import LoraConfig, TrainEngineConfig
from asyncflow.engines.factory import build_train_engine
from asyncflow.toy.tiny import SPECIALS, build_char_tokenizer

sys.path.insert(0, os.path.dirname(__file__))
from test_torch_train import batch, nll  # noqa: E402

VOCAB = len(build_char_tokenizer())
SPECIAL_IDS = dict(bos_token_id=SPECIALS.index("<s>"), eos_token_id=SPECIALS.index("</s>"), pad_token_id=0)
ATTENTION = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=VOCAB)


def family_configs():
    """One small config per family, each keeping what sets it apart from Llama."""
    common = dict(**ATTENTION, max_position_embeddings=256, **SPECIAL_IDS)
    return {
        # head_dim set apart from hidden_size / heads (32, not 16), q/k norms
        "qwen3": Qwen3Config(**common, head_dim=32, intermediate_size=96, tie_word_embeddings=True),
        # head_dim set, sliding and global layers, four norms a block, tied embeddings
        "gemma3_text": Gemma3TextConfig(**common, head_dim=32, intermediate_size=96, sliding_window=8, query_pre_attn_scalar=32),
        # the multimodal Gemma 3 (Gemma3ForConditionalGeneration): its text model's fields in text_config, a vision tower
        "gemma3": Gemma3Config(
            text_config=dict(**common, head_dim=32, intermediate_size=96, sliding_window=8),
            vision_config=dict(
                hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
            ),
            mm_tokens_per_image=4,
            boi_token_index=3,
            eoi_token_index=4,
            image_token_index=5,
        ),
        # fused qkv_proj and gate_up_proj
        "phi3": Phi3Config(**common, intermediate_size=96, original_max_position_embeddings=256),
        # norms after attention and MLP, q/k norms over the whole width
        "olmo2": Olmo2Config(**common, intermediate_size=96),
        # a mixture of experts with its own expert width and an explicit head_dim
        "qwen3_moe": Qwen3MoeConfig(
            **common, head_dim=32, intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2
        ),
        "mixtral": MixtralConfig(**common, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2),
        # GPT-2's own field names (n_embd, n_layer, n_head), no .model attribute (.transformer), LayerNorm, biases
        "gpt2": GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256, **SPECIAL_IDS),
    }


FAMILIES = list(family_configs())


def save_family(name: str, out: Path, seed: int = 0) -> Path:
    """A random tiny model of ``name`` and the character tokenizer, saved as a Hugging Face directory."""
    config = family_configs()[name]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    build_char_tokenizer().save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request, tmp_path_factory) -> Path:
    return save_family(request.param, tmp_path_factory.mktemp(request.param))


def weights_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in model.named_parameters()}


@pytest.mark.timeout(120)
def test_a_causal_lm_of_any_family_takes_a_step_and_saves_a_checkpoint_transformers_loads_with_equal_weights(
    family_dir, tmp_path
):
    trainer = build_train_engine(TrainEngineConfig(lr=1e-2, micro_batch_size=2), family_dir)
    before = dict(trainer.export_weights())
    result = trainer.train_step(batch(), nll)
    assert math.isfinite(result.loss) and result.grad_norm > 0
    after = dict(trainer.export_weights())
    assert any(not torch.equal(before[k], after[k]) for k in after), "the step changed no weight"

    trainer.save_checkpoint(tmp_path / "ckpt")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    got = weights_of(loaded)
    assert set(got) <= set(after)
    for name, tensor in got.items():
        assert torch.equal(tensor, after[name]), name
    # and it computes what the engine computes
    b = batch(seed=1)
    logits = loaded(input_ids=b.input_ids[1:2]).logits[0, :-1]
    ref = torch.log_softmax(logits, -1).gather(1, b.input_ids[1, 1:, None]).squeeze(1)
    assert torch.allclose(trainer.forward(b).logp[1, 5:], ref[4:], atol=1e-4)


@pytest.mark.timeout(120)
def test_a_critic_of_any_family_gives_a_value_per_token(family_dir):
    critic = build_train_engine(TrainEngineConfig(critic=True, micro_batch_size=2), family_dir)
    out = critic.forward(batch())
    assert out.values is not None and out.values.shape == batch().input_ids.shape
    assert torch.isfinite(out.values).all() and (out.values[:, 1:] != 0).any()


@pytest.mark.timeout(120)
def test_lora_with_train_norms_adapts_and_trains_every_norm_of_the_language_model_alone(family_dir, tmp_path):
    if family_dir.name.startswith("gpt2"):
        pytest.skip("GPT-2's attention is one Conv1D (c_attn): none of lora.target_modules' names")
    from peft import PeftModel

    trainer = build_train_engine(
        TrainEngineConfig(lr=1e-2, micro_batch_size=2, lora=LoraConfig(rank=2, train_norms=True)), family_dir
    )
    lm = trainer.net.lm  # type: ignore[attr-defined]
    decoder = next(n for n, m in lm.named_modules() if m is lm.get_decoder()) + "."  # a multimodal model's: not its vision tower
    norms = {
        n
        for n, m in lm.named_modules()
        if n.startswith(decoder) and ("Norm" in type(m).__name__ or type(m).__name__ == "LayerNorm")
    }
    trained = {n for n, p in lm.named_parameters() if p.requires_grad and ".lora_" not in n}
    assert norms and {n.rsplit(".", 1)[0] for n in trained} == norms
    assert trainer.adapted and all(m.startswith(decoder) for m in trainer.adapted)  # type: ignore[attr-defined]
    assert trainer.train_step(batch(), nll).grad_norm > 0
    trainer.save_checkpoint(tmp_path / "ckpt")  # peft puts the adapter on those layers, and no other
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt"), tmp_path / "ckpt" / "adapter")
    adapted = sorted(
        n.removeprefix("base_model.model.").removesuffix(".base_layer")
        for n, _ in peft.named_modules()
        if n.endswith(".base_layer")
    )
    assert adapted == trainer.adapted  # type: ignore[attr-defined]


@pytest.mark.timeout(120)
def test_lora_on_the_attention_projections_adapts_fused_ones_where_the_family_fuses_them(tmp_path):
    phi3 = save_family("phi3", tmp_path / "phi3")
    trainer = build_train_engine(TrainEngineConfig(micro_batch_size=2, lora=LoraConfig(rank=2)), phi3)
    adapted = {m.rsplit(".", 1)[-1] for m in trainer.adapted}  # type: ignore[attr-defined]
    assert adapted == {"qkv_proj", "o_proj"}


@pytest.mark.slow  # two interpreters importing torch + transformers: about 20 s on 2 cores
@pytest.mark.timeout(180)
def test_fsdp_shards_the_decoder_blocks_of_a_family_without_a_model_layers_attribute(tmp_path):
    import json
    import subprocess

    gpt2 = save_family("gpt2", tmp_path / "gpt2")
    worker = Path(__file__).with_name("fsdp_worker.py")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(worker),
        str(gpt2),
        str(tmp_path),
    ]
    done = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((tmp_path / "figures.json").read_text())
    single = build_train_engine(TrainEngineConfig(lr=1e-3, micro_batch_size=1), gpt2)
    results = [single.train_step(batch(), nll) for _ in range(2)]
    assert figures["loss"] == pytest.approx([r.loss for r in results], abs=1e-5)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    weights = dict(single.export_weights())
    for name, tensor in weights_of(loaded).items():
        assert torch.allclose(tensor, weights[name], atol=1e-5), name


@pytest.mark.timeout(120)
def test_shared_prompts_and_packing_give_the_padded_paths_logprobs_in_any_family(family_dir):
    from test_shared_prompts import grouped_batch

    b = grouped_batch(vocab=VOCAB)
    want = build_train_engine(TrainEngineConfig(micro_batch_size=8), family_dir).forward(b).logp
    resp = b.response_mask > 0
    for option in (dict(share_prompts=True), dict(packing=True)):
        got = build_train_engine(TrainEngineConfig(micro_batch_size=8, **option), family_dir).forward(b).logp
        assert torch.allclose(got[resp], want[resp], atol=1e-4), option


@pytest.mark.timeout(120)
def test_a_lora_checkpoint_of_a_fused_family_names_the_fused_layers_peft_loads_it_onto(tmp_path):
    import json

    from peft import PeftModel

    phi3 = save_family("phi3", tmp_path / "phi3")
    trainer = build_train_engine(TrainEngineConfig(lr=1e-2, micro_batch_size=2, lora=LoraConfig(rank=2)), phi3)
    trainer.train_step(batch(), nll)
    trainer.save_checkpoint(tmp_path / "ckpt")
    adapter = tmp_path / "ckpt" / "adapter"
    assert sorted(json.loads((adapter / "adapter_config.json").read_text())["target_modules"]) == ["o_proj", "qkv_proj"]
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(phi3, dtype=torch.float32), adapter)
    modules = dict(peft.named_modules())
    for name, want in trainer.adapters().items():  # type: ignore[attr-defined]
        got = modules["base_model.model." + name].lora_B["default"].weight
        assert torch.equal(got, want.B_OR) and want.B_OR.abs().sum() > 0, name
