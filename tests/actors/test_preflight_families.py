"""The driver's preflight on models of any family: it reads their config.json (memory,
a step's time, positions) whatever the family names its fields, and refuses what cannot
train as a causal LM (an encoder-decoder, an encoder) by its key before any process starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    BertConfig,
    Gemma3Config,
    Gemma3TextConfig,
    GPT2Config,
    MixtralConfig,
    Olmo2Config,
    Phi3Config,
    PretrainedConfig,
    Qwen3Config,
    Qwen3MoeConfig,
    T5Config,
)

from asyncflow.actors.driver.preflight import check, check_inputs, step_estimate
from asyncflow.config.load import ConfigError, load_config_text
from asyncflow.toy.tiny import build_char_tokenizer

VOCAB = len(build_char_tokenizer())
ATTENTION = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=VOCAB)
COMMON = dict(**ATTENTION, max_position_embeddings=256, pad_token_id=0)


def family_configs() -> dict[str, PretrainedConfig]:
    return {
        "qwen3": Qwen3Config(**COMMON, head_dim=32, intermediate_size=96),
        "gemma3_text": Gemma3TextConfig(**COMMON, head_dim=32, intermediate_size=96, sliding_window=8),
        # the multimodal Gemma 3: the text model's fields under text_config
        "gemma3": Gemma3Config(
            text_config=dict(**COMMON, head_dim=32, intermediate_size=96, sliding_window=8),
            vision_config=dict(
                hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
            ),
            mm_tokens_per_image=4,
        ),
        "phi3": Phi3Config(**COMMON, intermediate_size=96, original_max_position_embeddings=256),
        "olmo2": Olmo2Config(**COMMON, intermediate_size=96),
        "qwen3_moe": Qwen3MoeConfig(**COMMON, head_dim=32, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2),
        "mixtral": MixtralConfig(**COMMON, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2),
        "gpt2": GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256),
    }


def model_dir(config: PretrainedConfig, out: Path, weights: bool = False) -> Path:
    """config.json and the character tokenizer (and random weights with ``weights``)."""
    if weights:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            AutoModelForCausalLM.from_config(config).save_pretrained(out)
    else:
        config.save_pretrained(out)
    build_char_tokenizer().save_pretrained(out)
    return out


def run_config(path: Path, extra: str = ""):
    return load_config_text(f'[model]\npath = "{path}"\n[data]\nchat_template = true\n{extra}')


@pytest.mark.timeout(60)
@pytest.mark.parametrize("family", list(family_configs()))
def test_the_preflight_reads_memory_step_time_and_positions_from_the_config_json_of_any_family(family, tmp_path):
    path = model_dir(family_configs()[family], tmp_path / family, weights=True)
    cfg = run_config(path, "[rollout.sampling]\nmax_new_tokens = 300\n")
    with pytest.raises(ConfigError, match=r"max_new_tokens = 300: the model holds 256 positions"):
        check_inputs(cfg)  # positions read from the text model's fields (text_config, GPT-2's n_positions)
    cfg = run_config(path)
    check_inputs(cfg)
    assert check(cfg, str(path)).startswith("memory:")
    assert step_estimate(cfg, str(path), prompt_tokens=10).seconds > 0
    from asyncflow.planner.io import from_hf_config

    real = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())
    if family != "gemma3":  # the planner counts the text model alone: not the vision tower
        # GPT-2's MLP has two matrices where the planner counts a SwiGLU's three: an over-estimate
        assert from_hf_config(path).num_params == pytest.approx(real, rel=0.2 if family == "gpt2" else 0.1)


def encoder_decoder() -> PretrainedConfig:
    return T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2)


def encoder() -> PretrainedConfig:
    return BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("make", "why"),
    [(encoder_decoder, r"model_type 't5' is an encoder-decoder"), (encoder, r"model_type 'bert' is an encoder")],
)
def test_a_model_that_is_no_causal_lm_is_refused_by_model_path_before_the_run_directory_exists(make, why, tmp_path):
    from asyncflow.actors.driver.prepare import prepare_new

    path = model_dir(make(), tmp_path / "model")
    with pytest.raises(ConfigError, match=rf"model.path = '{path}': {why}.*decoder-only causal LM") as err:
        prepare_new(run_config(path), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert "docs/your-model-and-data.md" in str(err.value)


@pytest.mark.timeout(60)
def test_a_judge_reward_model_that_is_no_causal_lm_is_refused_by_reward_model_path(tmp_path):
    policy = model_dir(family_configs()["qwen3"], tmp_path / "policy")
    judge = model_dir(encoder(), tmp_path / "judge")
    cfg = run_config(policy, f'[reward_model]\nenabled = true\nkind = "judge"\npath = "{judge}"\n')
    with pytest.raises(ConfigError, match=rf"reward_model.path = '{judge}': model_type 'bert' is an encoder"):
        check_inputs(cfg)
    # a classifier is no causal LM, and need not be
    classifier = run_config(policy, f'[reward_model]\nenabled = true\nkind = "classifier"\npath = "{judge}"\n')
    check_inputs(classifier)


def test_a_config_json_without_a_model_type_is_refused_naming_what_is_missing(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    build_char_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"model.path = .*: config.json names no model_type"):
        check_inputs(run_config(tmp_path))


@pytest.mark.timeout(60)
def test_lora_on_a_model_without_layers_of_the_target_names_is_refused_before_any_process_starts(tmp_path):
    gpt2 = model_dir(family_configs()["gpt2"], tmp_path / "gpt2")
    with pytest.raises(ConfigError, match=r"train.engine.lora.target_modules = \[.*q_proj.*\]: .*'gpt2'.*c_attn.*rank = 0"):
        check_inputs(run_config(gpt2, "[train.engine.lora]\nrank = 4\n"))
    check_inputs(run_config(gpt2))  # without LoRA every weight trains: nothing to refuse
    phi3 = model_dir(family_configs()["phi3"], tmp_path / "phi3")  # fused qkv_proj: adapted for q/k/v_proj
    check_inputs(run_config(phi3, '[train.engine.lora]\nrank = 4\ntarget_modules = ["q_proj"]\n'))


def test_a_model_of_its_repositorys_own_code_is_refused_saying_no_remote_code_runs(tmp_path):
    config = {"model_type": "my_lm", "auto_map": {"AutoModelForCausalLM": "modeling_my.MyLM"}, "hidden_size": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    build_char_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(
        ConfigError, match=r"model.path = .*: model_type 'my_lm' is the repository's own code .*trust_remote_code"
    ):
        check_inputs(run_config(tmp_path))


@pytest.mark.timeout(60)
def test_a_mixture_of_experts_step_is_estimated_from_the_parameters_a_token_touches(tmp_path):
    """Sixteen times the experts at the same top-k: the same FLOPs per token but the
    router's, so about the same step estimate (counting every expert: 12 times it)."""
    from transformers import Qwen3MoeConfig

    def moe(num_experts: int):
        config = Qwen3MoeConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=num_experts, num_experts_per_tok=2,
            max_position_embeddings=256,
        )  # fmt: skip
        return model_dir(config, tmp_path / f"moe{num_experts}")

    few, many = moe(4), moe(64)
    est_few = step_estimate(run_config(few), str(few), prompt_tokens=10).seconds
    est_many = step_estimate(run_config(many), str(many), prompt_tokens=10).seconds
    assert est_few < est_many < 1.2 * est_few  # the router's logits grow with the experts
