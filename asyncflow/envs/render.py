"""Observations as token ids: text becomes a tool message rendered by the model's
chat template, exactly as the template would render it after an assistant turn.

The ids inserted for an observation are the template's text for
``[..., assistant, tool(observation)]`` (with the generation prompt) minus its text
for ``[..., assistant]``, tokenised: so the model sees between its turns what it
would see in a chat with tool results, and then the assistant marker it answers
after. A template that renders ``tool`` messages (Qwen, Llama 3, Hermes) uses them;
the tiny model's template renders every non-assistant message as
``<|user|>{content}``, so an observation there is ``<|user|>1776<|assistant|>``.
"""

from __future__ import annotations

from typing import Any

_PROBE = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def observation_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids of observation ``text`` as a tool message followed by the generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    before = tokenizer.apply_chat_template(_PROBE, tokenize=False)
    after = tokenizer.apply_chat_template(
        [*_PROBE, {"role": "tool", "content": text}], add_generation_prompt=True, tokenize=False
    )
    if not after.startswith(before):
        raise ValueError(
            "the chat template renders a conversation differently once a tool message follows it, so an "
            "observation cannot be appended to a trajectory; return token ids from Environment.step instead"
        )
    return tokenizer(after[len(before) :], add_special_tokens=False)["input_ids"]
