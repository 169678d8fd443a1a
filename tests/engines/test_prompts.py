"""Prompt encoding (engines/prompts.py): what the loader, evaluation and
``afctl plan --config`` all use to turn a run's prompts into token ids."""

import subprocess
import sys

import pytest

from asyncflow.engines.prompts import encode_chat_prompt, plain_prompt_ids, prompt_ids
from asyncflow.toy.tiny import build_char_tokenizer


@pytest.mark.timeout(60)
def test_prompt_ids_use_the_chat_template_only_when_the_config_asks():
    tokenizer = build_char_tokenizer()
    chat = prompt_ids(tokenizer, "3+4=", chat_template=True)
    assert chat == encode_chat_prompt(tokenizer, "3+4=")
    assert tokenizer.decode(chat) == "<|user|>3+4=<|assistant|>"
    raw = prompt_ids(tokenizer, "3+4=", chat_template=False)
    assert tokenizer.decode(raw) == "3+4=" and len(raw) == 4


@pytest.mark.timeout(60)
def test_a_plain_prompt_starts_with_the_bos_token_only_where_the_tokenizer_adds_one():
    """Gemma's tokenizer puts <bos> before a text (and the model reads text without it badly):
    a plain prompt keeps it, once; a tokenizer that adds none (the tiny one, SmolLM2's) gets none."""
    from tokenizers import processors

    tokenizer = build_char_tokenizer()
    bos = tokenizer.bos_token_id
    assert plain_prompt_ids(tokenizer, "3+4=") == tokenizer("3+4=")["input_ids"]  # adds nothing
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", bos), ("</s>", tokenizer.eos_token_id)]
    )
    assert tokenizer("3+4=")["input_ids"][0] == bos  # now it adds <bos> (and an </s> the prompt must not get)
    ids = prompt_ids(tokenizer, "3+4=", chat_template=False)
    assert ids == [bos, *tokenizer("3+4=", add_special_tokens=False)["input_ids"]]
    assert tokenizer.decode(ids) == "<s>3+4="
    assert plain_prompt_ids(tokenizer, "<s>3+4=") == ids  # a prompt that starts with it gets no second one


@pytest.mark.timeout(60)
def test_a_prompt_the_tiny_tokenizer_cannot_spell_is_refused_with_its_characters():
    with pytest.raises(ValueError, match="does not know: 'é'"):
        prompt_ids(build_char_tokenizer(), "café", chat_template=True)


@pytest.mark.timeout(60)
def test_the_prompt_module_needs_neither_torch_nor_transformers():
    code = (
        "import sys\nimport asyncflow.engines.prompts\n"
        "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
