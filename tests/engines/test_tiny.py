import hashlib

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncflow.toy.tiny import build_char_tokenizer, encode_chat_prompt, make_tiny_model


def test_tiny_model_directory_loads_in_transformers_with_its_tokenizer(qwen2_dir):
    model = AutoModelForCausalLM.from_pretrained(qwen2_dir)
    tokenizer = AutoTokenizer.from_pretrained(qwen2_dir)
    assert model.config.architectures == ["Qwen2ForCausalLM"]
    ids = encode_chat_prompt(tokenizer, "3+4=")
    assert tokenizer.decode(ids) == "<|user|>3+4=<|assistant|>"
    assert model(torch.tensor([ids])).logits.shape == (1, len(ids), model.config.vocab_size)


def test_character_tokenizer_round_trips_text_one_token_per_character():
    tokenizer = build_char_tokenizer()
    text = "rev:372 a+b=\\boxed{1/2}\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_same_seed_gives_byte_identical_weights(tmp_path):
    a = make_tiny_model(tmp_path / "a", seed=3)
    b = make_tiny_model(tmp_path / "b", seed=3)
    digest = lambda p: hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest()  # noqa: E731
    assert digest(a) == digest(b)


def test_supervised_warm_start_teaches_the_response_format(tmp_path):
    pairs = [("rev:123", "321"), ("rev:450", "054")] * 8
    model_dir = make_tiny_model(tmp_path / "w", seed=0, warm_start_pairs=pairs, warm_start_steps=60)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = encode_chat_prompt(tokenizer, "rev:123")
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=5, do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=0
    )
    assert tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True) == "321"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_saved_tiny_model_keeps_spaces_when_transformers_loads_its_tokenizer(tmp_path, arch):
    # transformers 5 rebuilds a qwen2 directory's tokenizer as Qwen2Tokenizer (byte-level BPE)
    # whatever tokenizer.json says; the tiny vocabulary must mean the same thing there
    out = make_tiny_model(tmp_path / arch, arch=arch, num_layers=1)
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = "What is 8 plus 9?\nIt is 17."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert ids == build_char_tokenizer()(text, add_special_tokens=False)["input_ids"]
    chat = encode_chat_prompt(tokenizer, "What is 8 plus 9?")
    assert tokenizer.decode(chat) == "<|user|>What is 8 plus 9?<|assistant|>"


def test_the_tiny_models_warm_start_reports_its_progress(tmp_path):
    """``afctl up`` prints these lines: the warm start used to be a silent minute."""
    from asyncflow.toy.tasks import make_task_model

    seen = []
    make_task_model(tmp_path / "m", warm_start_steps=20, progress=lambda done, total, loss: seen.append((done, total, loss)))
    assert [(done, total) for done, total, _ in seen] == [(d, 20) for d in range(2, 21, 2)]
    assert all(loss > 0 for _, _, loss in seen)
