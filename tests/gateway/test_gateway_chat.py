"""ChatFormat and Trajectory alone (no HTTP, no engine): messages to token ids, tokenised once."""

import copy

import pytest

from asyncflow.gateway.chat import FALLBACK_TEMPLATE, ChatFormat, TemplateError
from asyncflow.gateway.sessions import RequestError, Trajectory

Q = [{"role": "user", "content": "2+3?"}]


def test_a_tokenizer_without_a_chat_template_gets_the_fallback_template(tokenizer):
    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    fmt = ChatFormat(bare)
    assert fmt.template == FALLBACK_TEMPLATE
    assert bare.decode(fmt.prompt([{"role": "system", "content": "be brief"}, *Q])) == "system: be brief\nuser: 2+3?\nassistant: "
    # the model ended its reply with eos; the fallback template closes a turn with a newline it did not write
    reply = bare("5", add_special_tokens=False)["input_ids"] + [bare.eos_token_id]
    history = [*Q, {"role": "assistant", "content": "5"}]
    ids = fmt.continuation(history, reply, [{"role": "user", "content": "and 4+4?"}])
    assert bare.decode(ids) == "\nuser: and 4+4?\nassistant: "


def test_with_the_tiny_template_a_stopped_reply_needs_no_closing_and_a_cut_one_gets_the_template_closing(tokenizer):
    fmt = ChatFormat(tokenizer)
    five = tokenizer("5", add_special_tokens=False)["input_ids"]
    history = [*Q, {"role": "assistant", "content": "5"}]
    new = [{"role": "user", "content": "ok"}]
    assert tokenizer.decode(fmt.continuation(history, five + [tokenizer.eos_token_id], new)) == "<|user|>ok<|assistant|>"
    assert tokenizer.decode(fmt.continuation(history, five, new)) == "</s><|user|>ok<|assistant|>"


def test_a_template_that_rewrites_earlier_turns_is_refused_rather_than_re_tokenised(tokenizer):
    odd = copy.deepcopy(tokenizer)
    # a template that shows only the last two messages: the recorded prefix is not a prefix of the grown text
    odd.chat_template = "{% for m in messages[-2:] %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
    fmt = ChatFormat(odd)
    with pytest.raises(TemplateError, match="new session"):
        fmt.continuation([*Q, {"role": "assistant", "content": "5"}], [20], [{"role": "user", "content": "ok"}])


def test_a_trajectory_appends_turns_and_refuses_an_edited_history():
    t = Trajectory(session="s", prompt_ids=[4, 20, 5])
    t.add_turn(Q, [], [30, 31, 2], [-1.0, -2.0, -0.5], "ab", "stop", version=3)
    t.add_turn(
        [*Q, {"role": "assistant", "content": "ab"}, {"role": "user", "content": "c"}], [4, 40, 5], [50], [-0.1], "d", "length", 4
    )
    assert t.response_ids == [30, 31, 2, 4, 40, 5, 50]
    assert t.loss_mask == [1, 1, 1, 0, 0, 0, 1]
    assert t.rollout_logp == [-1.0, -2.0, -0.5, 0.0, 0.0, 0.0, -0.1]
    assert t.token_versions == [3, 3, 3, 4, 4, 4, 4] and t.version == 3
    assert t.new_messages([*t.messages, {"role": "user", "content": "e"}]) == [{"role": "user", "content": "e"}]
    edited = [*Q, {"role": "assistant", "content": "XX"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    with pytest.raises(RequestError, match="from message 1 on") as refused:
        t.new_messages([*edited, {"role": "user", "content": "e"}])
    assert refused.value.status == 409
