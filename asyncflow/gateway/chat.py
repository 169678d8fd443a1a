"""Chat formatting for the gateway: messages to token ids, tokenised once.

The first request of a session is rendered with the chat template (generation prompt
included) and tokenised. Every later request must repeat the recorded conversation
and add messages after it; only those new messages are rendered and tokenised, and
the tokens of the earlier turns, the model's own included, are reused as they are.

``continuation`` finds the new messages' text as the template renders it: the text of
the whole conversation minus the text of the recorded one. Between them goes what the
template writes after an assistant message that the model did not produce itself
(for example the newline after ChatML's ``<|im_end|>``, or the closing tag of a
response cut by ``max_tokens``): context tokens, outside the loss.

A tokenizer without a chat template gets ``FALLBACK_TEMPLATE``: one line per message,
``<role>: <content>``, and ``assistant: `` as the generation prompt.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from asyncflow.engines.prompts import CHARS, CHAT_TEMPLATE
from asyncflow.engines.tokenizer import longest_token_chars

FALLBACK_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)
"""The template of a tokenizer that has none: ``system: ...\\nuser: ...\\nassistant: `` (docs/gateway.md)."""

Message = dict[str, str]  # {"role": ..., "content": ...}


class TemplateError(ValueError):
    """The conversation cannot be extended token for token (the template rewrites
    earlier turns once the conversation grows), or its text cannot be tokenised."""


class ChatFormat:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.template: str = getattr(tokenizer, "chat_template", None) or FALLBACK_TEMPLATE
        # the tiny character-level tokenizer knows only CHARS (anything else would become <unk>)
        self.alphabet = frozenset(CHARS) if self.template == CHAT_TEMPLATE else None

    @functools.cached_property
    def token_chars(self) -> int:
        """``longest_token_chars`` of the tokenizer (read at the first request)."""
        return longest_token_chars(self.tokenizer)

    def render(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), chat_template=self.template, add_generation_prompt=generation_prompt, tokenize=False
        )

    def check(self, messages: Sequence[Message]) -> None:
        """Refuse text the tokenizer cannot spell (the tiny model's alphabet)."""
        if self.alphabet is None:
            return
        for i, m in enumerate(messages):
            unknown = sorted(set(m["content"]) - self.alphabet)
            if unknown:
                raise TemplateError(
                    f"messages[{i}].content has characters the model's tokenizer does not know: {''.join(unknown)!r} "
                    "(the tiny model knows only asyncflow.toy.tiny.CHARS)"
                )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def prompt(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of a new conversation, ending in the generation prompt."""
        self.check(messages)
        return self.encode(self.render(messages, True))

    def continuation(self, history: Sequence[Message], generated_ids: Sequence[int], new: Sequence[Message]) -> list[int]:
        """Token ids to append after a recorded conversation whose last message is the
        assistant turn ``generated_ids`` (its exact tokens, already recorded): the
        template's closing of that turn the model did not write, then ``new``, then the
        generation prompt."""
        self.check(new)
        before = self.render(history[:-1], True)  # ... up to the generation prompt of the last turn
        recorded = self.render(history, False)  # ... that turn closed by the template
        grown = self.render([*history, *new], True)
        if not (recorded.startswith(before) and grown.startswith(recorded)):
            raise TemplateError(
                "the chat template renders the earlier turns differently once the conversation grows, so the recorded "
                "tokens cannot be extended as they are: start a new session for this conversation"
            )
        closing = recorded[len(before) :]  # the last assistant turn as the template writes it
        produced = self.tokenizer.decode(list(generated_ids), skip_special_tokens=False)
        content = history[-1]["content"]
        if closing.startswith(produced):
            rest = closing[len(produced) :]
        elif closing.startswith(content):
            rest = closing[len(content) :]  # the model's stop token is not the template's closing (fallback template)
        else:
            raise TemplateError(
                "the chat template rewrites the assistant's reply (it is not its text followed by a closing): the recorded "
                "tokens cannot be extended; start a new session for this conversation"
            )
        return self.encode(rest + grown[len(recorded) :])
