"""Prompt encoding: a prompt's token ids, as the loader puts them into the queue.

``prompt_ids`` is what every path that tokenizes a run's prompts uses (the loader
through ``actors/runtime/run_dir.encode_prompt``, held-out evaluation, ``afctl plan --config``):
through the model's chat template when ``data.chat_template``, else the raw text (after
the tokenizer's BOS token where it adds one: ``plain_prompt_ids``).
``encode_chat_prompt`` renders a one-turn user prompt ending in the assistant marker.

The tiny model's alphabet (``CHARS``) and chat template (``CHAT_TEMPLATE``) are
defined here, not in ``toy/tiny.py`` (which builds the tokenizer from them and is
meant for tests and examples): encoding refuses a prompt the tiny tokenizer cannot
spell, so it needs them, and it must not import torch or transformers to know them.
"""

from __future__ import annotations

CHARS = "0123456789+-*/=()., ?:;!'\"<>[]{}\\^_|#%&$abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n"
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>{{ m['content'] }}</s>"
    "{% else %}<|user|>{{ m['content'] }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def encode_chat_prompt(tokenizer, prompt: str) -> list[int]:
    """Token ids of a one-turn user prompt ending in the assistant marker. With the
    tiny tokenizer, a prompt with a character outside ``CHARS`` is refused (it would
    become ``<unk>``, or vanish under ``Qwen2Tokenizer``)."""
    if tokenizer.chat_template == CHAT_TEMPLATE:
        unknown = sorted(set(prompt) - set(CHARS))
        if unknown:
            raise ValueError(
                f"prompt {prompt[:60]!r} has characters the tiny model's tokenizer does not know: "
                f"{''.join(unknown)!r}; it knows only asyncflow.toy.tiny.CHARS (ASCII letters, "
                "digits, space, newline and punctuation): use a model of your own (model.path) for other text"
            )
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def plain_prompt_ids(tokenizer, prompt: str) -> list[int]:
    """Token ids of a prompt given as plain text (no chat template): the text after the
    tokenizer's BOS token when the tokenizer itself puts one before a text (Gemma, Llama
    2: a model trained so reads text without it badly: Gemma 3 270M's perplexity on a
    paragraph of Wikipedia is 8 with its ``<bos>`` and 162 without), never an EOS (the
    response follows the prompt). A tokenizer that adds no BOS (SmolLM2's, the tiny
    model's) gives the text's ids alone."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id
    if bos is None or (ids and ids[0] == bos):
        return ids
    with_specials = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    return [bos, *ids] if with_specials and with_specials[0] == bos else ids


def prompt_ids(tokenizer, prompt: str, chat_template: bool) -> list[int]:
    """The prompt's token ids, through the chat template when ``data.chat_template``,
    else as plain text (``plain_prompt_ids``: with the BOS token the tokenizer adds)."""
    return encode_chat_prompt(tokenizer, prompt) if chat_template else plain_prompt_ids(tokenizer, prompt)
