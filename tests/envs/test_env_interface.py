"""The environment interface without a model: the calc tool, the tool-call formats,
observation rendering through the chat template, loading by dotted path."""

from __future__ import annotations

import pytest

from asyncflow.envs.base import Action, Environment, Sample, load_env_factory
from asyncflow.envs.calc import CalcEnv, calc
from asyncflow.envs.render import observation_ids
from asyncflow.envs.tools import JsonFormat, TagFormat, ToolCall, ToolEnvironment, tool_format

QWEN_LIKE_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if tools %}<tool_call>{% endif %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_calc_evaluates_integer_arithmetic_and_answers_error_to_anything_else():
    assert calc("37*48") == "1776"
    assert calc(" (2+3)*4-1 ") == "19"
    assert calc("7//2") == "3"
    assert calc("3*") == "error"
    assert calc("__import__('os')") == "error"
    assert calc("1/0") == "error"  # true division is not integer arithmetic
    assert calc("9" * 41) == "error"


def test_the_tag_format_finds_each_call_of_a_known_tool_only():
    fmt = TagFormat(["calc"])
    assert fmt.parse("<calc>3*7</calc> then <calc>1+1</calc>") == [ToolCall("calc", ("3*7",)), ToolCall("calc", ("1+1",))]
    assert fmt.parse("<other>3</other><calc>3*7") == []


def test_the_json_format_reads_name_and_arguments_and_skips_malformed_blocks():
    fmt = JsonFormat()
    text = '<tool_call>{"name": "calc", "arguments": {"expr": "2*3"}}</tool_call><tool_call>{oops}</tool_call>'
    assert fmt.parse(text) == [ToolCall("calc", (), (("expr", "2*3"),))]


def test_the_format_follows_the_chat_template(tokenizer):
    assert isinstance(tool_format(tokenizer, ["calc"]), TagFormat)  # the tiny template has no tool calls

    class Templated:
        chat_template = QWEN_LIKE_TEMPLATE

    assert isinstance(tool_format(Templated(), ["calc"]), JsonFormat)


def test_an_observation_is_rendered_as_the_chat_template_renders_a_tool_message(tokenizer):
    ids = observation_ids(tokenizer, "1776")
    assert tokenizer.decode(ids) == "<|user|>1776<|assistant|>"
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|user|>") and ids[-1] == tokenizer.convert_tokens_to_ids("<|assistant|>")


def test_the_calc_env_runs_the_tool_then_scores_the_final_answer(tokenizer):
    env = CalcEnv()
    env.bind(tokenizer)
    assert env.reset(Sample(prompt="37*48=", prompt_ids=[1], answer="1776")) is None
    step = env.step(Action(text="<calc>37*48</calc>", ids=[]))
    assert (step.observation, step.reward, step.done, step.info["tool_calls"]) == ("1776", 0.0, False, 1)
    assert env.step(Action(text="1776", ids=[])).reward == 1.0
    assert env.step(Action(text="1777", ids=[])).reward == 0.0


def test_a_json_tool_call_passes_its_arguments_as_keywords():
    class Templated:
        chat_template = QWEN_LIKE_TEMPLATE

    class Env(ToolEnvironment):
        tools = {"add": lambda a, b: a + b}

    env = Env()
    env.bind(Templated())
    env.reset(Sample(prompt="", prompt_ids=[1], answer=""))
    step = env.step(Action(text='<tool_call>{"name": "add", "arguments": {"a": 2, "b": 5}}</tool_call>', ids=[]))
    assert step.observation == "7"


def test_an_environment_is_loaded_by_dotted_path_and_a_wrong_one_is_refused_with_the_fix():
    assert load_env_factory("asyncflow.envs.calc:CalcEnv") is CalcEnv
    with pytest.raises(ValueError, match="package.module:Name"):
        load_env_factory("asyncflow.envs.calc.CalcEnv")
    with pytest.raises(ValueError, match="no callable 'Nope'"):
        load_env_factory("asyncflow.envs.calc:Nope")
    with pytest.raises(ValueError, match="without arguments"):
        load_env_factory("asyncflow.envs.calc:calc_example")
    with pytest.raises(ValueError, match="not an asyncflow.envs.Environment"):
        load_env_factory("collections:OrderedDict")
    assert issubclass(CalcEnv, Environment)


def test_a_config_with_no_reward_function_needs_an_environment():
    from asyncflow.config.load import ConfigError, load_config_text

    with pytest.raises(ConfigError, match="reward.functions"):
        load_config_text("[reward]\nfunctions = []")
    cfg = load_config_text('[reward]\nfunctions = []\n[env]\npath = "asyncflow.envs.calc:CalcEnv"\nreward = "replace"')
    assert cfg.env.max_turns == 4 and cfg.env.reward == "replace"
