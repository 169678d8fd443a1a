import json

import pytest

from asyncflow.algorithms.rewards import (
    RewardError,
    call_reward,
    exact_match,
    format_reward,
    load_reward_fn,
    math_answer,
    parse_number,
    weighted_sum,
)
from asyncflow.toy import tasks


def score(fn, responses, answers, finish=None):
    n = len(responses)
    return fn([""] * n, responses, answers, finish or ["stop"] * n)


def test_exact_match_ignores_surrounding_whitespace_only():
    assert score(exact_match, [" 42\n", "42.0", "x"], ["42", "42", "y"]) == [1.0, 0.0, 0.0]


def test_math_answer_compares_numbers_fractions_and_boxed_answers():
    responses = [
        "so \\boxed{\\frac{3}{4}}",
        "the answer is 0.75.",
        "total 1,000",
        "\\boxed{-2}",
        "7 then 8",
        "\\boxed{3/4}",
        "none",
    ]
    answers = ["3/4", "\\frac{3}{4}", "1000", "-2", "8", "0.75", "1"]
    assert score(math_answer, responses, answers) == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    assert score(math_answer, ["\\boxed{2}", "3/0"], ["3", "1"]) == [0.0, 0.0]


def test_numbers_parse_to_exact_fractions():
    assert parse_number("\\dfrac{1}{2}") == parse_number("0.5") == parse_number(" $1/2$ ")
    assert parse_number("-\\frac{1}{3}") * 3 == -1
    assert parse_number("1/0") is None and parse_number("abc") is None


def test_format_reward_needs_the_pattern_and_a_stop_token():
    fn = format_reward(r"\d{3}")
    assert score(fn, ["123", "12", "123"], ["", "", ""], ["stop", "stop", "length"]) == [1.0, 0.0, 0.0]


def test_weighted_sum_gives_partial_credit():
    fn = weighted_sum((0.1, format_reward(r"\d+")), (0.9, exact_match))
    assert score(fn, ["7", "8", "x"], ["7", "7", "7"]) == pytest.approx([1.0, 0.1, 0.0])


def test_custom_rewards_load_by_dotted_path_or_builtin_name():
    assert load_reward_fn("asyncflow.toy.tasks:reward") is tasks.reward
    assert load_reward_fn("math_answer") is math_answer
    with pytest.raises(ValueError, match="no callable 'nope'"):
        load_reward_fn("asyncflow.toy.tasks:nope")
    with pytest.raises(ValueError, match="fn\\(prompts, responses, answers, finish_reasons\\)"):
        load_reward_fn("asyncflow.toy.tasks:make_example" if hasattr(tasks, "make_example") else "json:dumps")
    with pytest.raises(ValueError, match="package.module:function"):
        load_reward_fn("not_a_path")


def test_a_reward_returning_the_wrong_count_is_an_error():
    with pytest.raises(ValueError, match=r"returned 1 values for 2 responses \(expected 2, got 1\)"):
        call_reward(lambda p, r, a, f: [1.0], ["a", "b"], ["a", "b"], ["a", "b"], ["stop", "stop"])


def test_add_task_reward_gives_format_credit_and_exact_credit(tmp_path):
    path = tasks.write_jsonl(tmp_path / "add.jsonl", num_examples=5, seed=1)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(str(eval(r["prompt"][:-1])) == r["answer"] for r in rows)
    got = tasks.reward(["3+4="] * 4, ["7", "8", "7x", "7"], ["7"] * 4, ["stop", "stop", "stop", "length"])
    assert got == pytest.approx([1.0, 0.1, 0.0, 0.9])


def test_reverse_task_reward_and_dataset_file(tmp_path):
    path = tasks.write_jsonl(tmp_path / "rev.jsonl", num_examples=5, seed=1, task="reverse")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 5 and all(r["answer"] == r["prompt"].split(":")[1][::-1] for r in rows)
    got = tasks.reverse_reward(["rev:372"] * 4, ["273", "27", "723", "273"], ["273"] * 4, ["stop", "stop", "stop", "length"])
    # 0.1 format + 0.9 x digits in place: 1.0; 0.9 x 2/3; 0.1 + 0.9 x 1/3; 0.9
    assert got == pytest.approx([1.0, 0.6, 0.4, 0.9])


def test_add1_task_is_one_digit_addition_in_words_scored_by_its_last_number(tmp_path):
    """examples/gemma3.toml's task: 100 distinct prompts (operands 0..9 in words), the sum as
    the answer; math_answer scores a base model's one-line answer, the equation included."""
    path = tasks.write_jsonl(tmp_path / "add1.jsonl", num_examples=2000, seed=0, task="add1")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    words = {w: i for i, w in enumerate(tasks.ONE_DIGIT_WORDS)}
    for r in rows:
        a, b = r["prompt"].removeprefix("Question: What is ").removesuffix("?\nAnswer:").split(" plus ")
        assert r["answer"] == str(words[a] + words[b])
    assert len({r["prompt"] for r in rows}) == 100
    got = math_answer([""] * 4, [" 6+4\n", " 6 + 4 = 10\n", " 10", " ten"], ["10"] * 4, ["stop"] * 4)
    assert got == [0.0, 1.0, 1.0, 0.0]


def nan_for_the_second(prompts, responses, answers, finish_reasons):
    return [1.0, float("nan"), 0.0][: len(responses)]


def inf_everywhere(prompts, responses, answers, finish_reasons):
    return [float("inf")] * len(responses)


def one_value_short(prompts, responses, answers, finish_reasons):
    return [1.0] * (len(responses) - 1)


_ROWS = (["1+1=", "2+2=", "3+3="], ["2", "4", "6"], ["2", "4", "6"], ["stop"] * 3)


@pytest.mark.timeout(10)
def test_a_nan_reward_is_refused_naming_the_function_and_the_row():
    with pytest.raises(ValueError, match=r"test_rewards:nan_for_the_second returned nan for sample 1 \(row 41, prompt '2\+2='\)"):
        call_reward(nan_for_the_second, *_ROWS, row_ids=[40, 41, 42])


@pytest.mark.timeout(10)
def test_an_infinite_reward_inside_a_weighted_sum_is_refused_naming_the_term():
    fn = weighted_sum((0.5, exact_match), (0.5, inf_everywhere))
    with pytest.raises(ValueError, match=r"test_rewards:inf_everywhere returned inf for sample 0 \(prompt '1\+1='\)"):
        call_reward(fn, *_ROWS)


@pytest.mark.timeout(10)
def test_a_term_of_a_weighted_sum_returning_too_few_values_is_refused_not_padded():
    fn = weighted_sum((0.5, exact_match), (0.5, one_value_short))
    with pytest.raises(ValueError, match=r"test_rewards:one_value_short returned 2 values for 3 responses \(expected 3, got 2\)"):
        call_reward(fn, *_ROWS)


@pytest.mark.timeout(10)
def test_a_reward_that_is_not_a_number_is_refused():
    with pytest.raises(ValueError, match=r"returned 'high' for sample 0"):
        call_reward(lambda p, r, a, f: ["high"] * len(r), *_ROWS)


@pytest.mark.timeout(10)
def test_a_nan_term_of_a_weighted_sum_names_the_row_ids_given_to_call_reward():
    fn = weighted_sum((1.0, nan_for_the_second))
    with pytest.raises(ValueError, match=r"nan_for_the_second returned nan for sample 1 \(row 8, prompt '2\+2='\)"):
        call_reward(fn, *_ROWS, row_ids=[7, 8, 9])


def test_a_string_is_not_a_reward_whatever_it_spells():
    import numpy as np

    with pytest.raises(RewardError, match=r"returned str '1\.0', not a list of floats"):
        call_reward(lambda p, r, a, f: "1.0", ["x"] * 3, ["y"] * 3, ["z"] * 3, ["stop"] * 3)
    with pytest.raises(RewardError, match=r"returned '1\.0' for sample 0 .*a reward must be a finite number"):
        call_reward(lambda p, r, a, f: ["1.0"], ["x"], ["y"], ["z"], ["stop"])
    with pytest.raises(RewardError, match=r"returned dict"):
        call_reward(lambda p, r, a, f: {"x": 1.0}, ["x"], ["y"], ["z"], ["stop"])
    # numbers of any kind are numbers
    assert call_reward(lambda p, r, a, f: [True, np.float32(0.5), 2], ["x"] * 3, ["y"] * 3, ["z"] * 3, ["stop"] * 3) == [
        1.0,
        0.5,
        2.0,
    ]
