"""The OpenAI chat-completions request, as the gateway reads it (HTTP JSON, not an nng
wire message: those live in core/protocol.py).

Unknown fields are ignored, as OpenAI-compatible servers do; fields that would change
what is generated in a way the gateway cannot honour (``n > 1``, ``tools``) are refused
with HTTP 400 rather than ignored. ``stream`` is answered as server-sent events (the
whole reply in one chunk, once generated); ``stop`` cuts the reply after the token that
completes the first stop sequence (at most 4, as OpenAI's).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from asyncflow.gateway.chat import Message
from asyncflow.gateway.sessions import RequestError


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str = ""


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[Any] | None = None

    def plain(self, i: int) -> Message:
        if self.tool_calls:
            raise RequestError(400, f"messages[{i}].tool_calls: tool calls are not supported by the gateway")
        if self.content is None:
            text = ""
        elif isinstance(self.content, str):
            text = self.content
        else:
            kinds = sorted({p.type for p in self.content} - {"text"})
            if kinds:
                raise RequestError(400, f"messages[{i}].content: only text parts are supported, not {', '.join(kinds)}")
            text = "".join(p.text for p in self.content)
        return {"role": self.role, "content": text}


MAX_STOPS = 4
MAX_STOP_CHARS = 256


class ChatRequest(msgspec.Struct, kw_only=True):
    model: str = ""
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    n: int = 1
    stream: bool = False
    stop: str | list[str] | None = None
    tools: list[Any] | None = None
    user: str | None = None
    logprobs: bool = False
    temperature: float | None = None
    top_p: float | None = None

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def refuse_unsupported(self) -> None:
        if len(self.stops) > MAX_STOPS or any(not s or len(s) > MAX_STOP_CHARS for s in self.stops):
            raise RequestError(400, f"stop: give at most {MAX_STOPS} stop sequences of 1 to {MAX_STOP_CHARS} characters each")
        if self.n != 1:
            raise RequestError(400, f"n = {self.n}: the gateway generates one choice per request (n = 1)")
        if self.tools:
            raise RequestError(400, "tools are not supported by the gateway: describe tools in the messages instead")


_decoder = msgspec.json.Decoder(ChatRequest)


def decode_request(body: bytes) -> ChatRequest:
    try:
        req = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise RequestError(400, f"invalid chat completion request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise RequestError(400, f"the request body is not JSON: {exc}") from None
    req.refuse_unsupported()
    return req


class RewardRequest(msgspec.Struct, kw_only=True):
    reward: float
    group: str | None = None
    """The session's group key (sessions sharing it form a GRPO group); else its ``X-Group-Id``."""


def decode_reward(body: bytes) -> RewardRequest:
    try:
        return msgspec.json.decode(body, type=RewardRequest)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise RequestError(400, f'a reward is a JSON object {{"reward": <number>}}: {exc}') from None
