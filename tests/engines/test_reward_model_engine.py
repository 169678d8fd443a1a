"""Reward models behind RewardScorer (engines/reward_model.py) on real tiny models:
the tiny classifier trained on the addition task, and a causal LM as a judge."""

from __future__ import annotations

import pytest
import torch

from asyncflow.engines.factory import build_reward_scorer
from asyncflow.engines.reward_model import ClassifierScorer, JudgeScorer, encode_pair, parse_score
from asyncflow.toy.tasks import reward_model_examples
from asyncflow.toy.tiny import build_char_tokenizer, encode_chat_prompt, make_tiny_reward_model


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    path, losses = make_tiny_reward_model(tmp_path_factory.mktemp("rm"), reward_model_examples(seed=0), steps=150)
    return path, losses


def test_a_pair_is_encoded_as_the_chat_turns_of_prompt_and_response_then_the_stop_token():
    tok = build_char_tokenizer()
    expected = encode_chat_prompt(tok, "3+4=") + tok("7", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert encode_pair(tok, "3+4=", "7") == expected


@pytest.mark.timeout(120)
def test_the_tiny_reward_model_learns_to_score_correct_answers_above_wrong_and_malformed_ones(reward_model_dir):
    path, losses = reward_model_dir
    assert sum(losses[-20:]) / 20 < 0.5 * sum(losses[:5]) / 5  # it trained
    scorer = build_reward_scorer("classifier", path, batch_size=8)
    held_out = reward_model_examples(300, seed=99)  # other prompts' draws than training
    scores = scorer.score([p for p, _, _ in held_out], [r for _, r, _ in held_out], ["" for _ in held_out])
    right = [s for s, (_, _, t) in zip(scores, held_out) if t > 0.5]
    wrong = [s for s, (_, _, t) in zip(scores, held_out) if t <= 0.5]
    assert sum(right) / len(right) > sum(wrong) / len(wrong) + 0.2


@pytest.mark.timeout(120)
def test_batched_scores_are_the_model_head_at_each_pair_last_token(reward_model_dir):
    from transformers import AutoModelForSequenceClassification

    path, _ = reward_model_dir
    scorer = ClassifierScorer(path, batch_size=3)
    prompts, responses = ["3+4=", "9+9=", "0+1=", "5+2="], ["7", "18", "x", "1234"]
    batched = scorer.score(prompts, responses, [""] * 4)  # two batches, padded to different lengths
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = build_char_tokenizer()
    with torch.no_grad():
        alone = [float(model(input_ids=torch.tensor([encode_pair(tok, p, r)])).logits[0, 0]) for p, r in zip(prompts, responses)]
    assert batched == pytest.approx(alone, abs=1e-5)
    assert len(set(round(s, 4) for s in batched)) > 1  # the scores depend on the pair


def test_a_classifier_with_more_than_one_label_is_refused(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from asyncflow.toy.tiny import tiny_config

    config = tiny_config()
    config.num_labels = 2
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path)
    build_char_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="num_labels = 1"):
        ClassifierScorer(tmp_path)


@pytest.mark.parametrize("text,score", [("7", 7.0), ("score: -0.5 of 9", -0.5), ("12abc", 12.0), ("no number", 3.0), ("", 3.0)])
def test_a_judgement_scores_its_first_number_or_the_default(text, score):
    assert parse_score(text, default=3.0) == score


@pytest.mark.timeout(120)
def test_a_judge_scores_each_pair_by_the_number_it_generates(tmp_path):
    from asyncflow.toy.tasks import make_task_model

    judge_dir = make_task_model(tmp_path / "judge", seed=0, warm_start_steps=150)  # it answers "a+b=" with digits
    judge = build_reward_scorer("judge", judge_dir, template="{response}", batch_size=4, max_new_tokens=4, default=-1.0)
    assert isinstance(judge, JudgeScorer)
    # the judge is asked the response as its prompt: "3+4=" makes it write a sum
    responses = ["3+4=", "1+1=", "9+8=", "2+5="]
    texts = judge.judgements([""] * 4, responses, [""] * 4)
    scores = judge.score([""] * 4, responses, [""] * 4)
    assert scores == [parse_score(t, -1.0) for t in texts]
    assert any(t.strip().isdigit() for t in texts), texts  # the warm-started judge writes numbers
    assert all(s == float(t.strip()) for s, t in zip(scores, texts) if t.strip().isdigit())


def test_an_unknown_kind_is_refused(tmp_path):
    with pytest.raises(ValueError, match="'classifier' or 'judge'"):
        build_reward_scorer("oracle", tmp_path)
