"""Held-out evaluation ([eval]): the split, the scoring, checkpoints/best, and one
`afctl up` that evaluates after 2 of its 3 steps and the last, under a warmup + cosine lr schedule.
With `[env] path`: multi-turn episodes (the calc tool run by a scripted model, two
turns of an untrained one) and one `afctl up` whose val/env/* land in metrics.jsonl."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest
from wf_helpers import afctl, read_jsonl, write_config

from asyncflow.actors.driver.collector import progress_line
from asyncflow.actors.evaluation.evaluator import Evaluator, read_best, save_best
from asyncflow.actors.runtime.run_dir import PromptOrder, Run, read_prompts, split_prompts
from asyncflow.actors.trainer.checkpoints import latest_checkpoint
from asyncflow.config.load import ConfigError, load_config
from asyncflow.engines.base import Completion
from asyncflow.engines.config import TrainEngineConfig
from asyncflow.engines.lr_schedule import lr_at


@pytest.mark.timeout(10)
def test_the_split_holds_out_whole_prompts_the_same_way_for_the_same_seed():
    prompts = ["1+1=", "2+2=", "1+1=", "3+3=", "4+4=", "2+2=", "5+5="]
    train, heldout = split_prompts(prompts, 2, seed=3)
    assert (train, heldout) == split_prompts(prompts, 2, seed=3)
    held = {prompts[i] for i in heldout}
    assert len(heldout) == len(held) == 2
    assert not held & {prompts[i] for i in train}  # a repeated prompt is held out everywhere
    assert sorted(train + [i for i, p in enumerate(prompts) if p in held]) == list(range(len(prompts)))
    assert split_prompts(prompts, 0, seed=3) == (list(range(7)), [])
    with pytest.raises(ValueError, match=r"eval.num_prompts = 5: the data has only 5 distinct prompts.*at most 4"):
        split_prompts(prompts, 5, seed=3)


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    """A run directory as `afctl up` prepares it: untrained tiny model, add-task data, [eval] on."""
    from tiny_config import tiny_config_text

    from asyncflow.actors.driver.prepare import prepare_new
    from asyncflow.config.load import load_config_text

    root = tmp_path_factory.mktemp("evalrun")
    cfg = load_config_text(tiny_config_text({"eval": {"every_steps": 1, "num_prompts": 6, "mode": "pass_at_k", "k": 3}}))
    _, rd, _ = prepare_new(cfg, root / "run")
    return Run(rd)


class ScriptedEngine:
    """Stands in for the rollout engine: answers each prompt with the given texts."""

    def __init__(self, tokenizer, texts_per_prompt):
        self.tokenizer, self.texts = tokenizer, texts_per_prompt

    def load_weights(self, named_tensors, version):
        self.version = version

    def generate(self, prompts, params):
        assert params.n == 3 and params.temperature > 0
        return [
            Completion(
                prompt_index=p,
                sample_index=s,
                response_ids=self.tokenizer(text, add_special_tokens=False)["input_ids"],
                logprobs=[],
                finish_reason="stop",
                version=self.version,
            )
            for p in range(len(prompts))
            for s, text in enumerate(self.texts[p])
        ]


@pytest.mark.timeout(60)
def test_pass_at_k_counts_a_prompt_with_any_correct_sample_and_accuracy_counts_samples(eval_run):
    evaluator = Evaluator(eval_run)
    assert len(evaluator.prompt_ids) == 6
    answers = evaluator.answers
    wrong = [str((int(a) + 1) % 19) for a in answers]
    # prompt 0: all three right; prompts 1-2: one of three; the rest: none
    texts = [[a] * 3 if p == 0 else [w, a, w] if p in (1, 2) else [w] * 3 for p, (a, w) in enumerate(zip(answers, wrong))]
    evaluator.engine = ScriptedEngine(evaluator.tokenizer, texts)
    values = evaluator.evaluate([], version=4)
    assert values["val/pass_at_k"] == pytest.approx(3 / 6)
    assert values["val/accuracy"] == pytest.approx(5 / 18)
    assert 5 / 18 <= values["val/reward_mean"] < 1.0  # wrong answers still earn the format reward


@pytest.mark.timeout(60)
def test_a_real_engine_evaluates_the_held_out_prompts_with_the_trainers_weights(eval_run):
    from asyncflow.engines.hf import load_model

    evaluator = Evaluator(eval_run)
    weights = list(load_model(eval_run.launch.model_dir).named_parameters())
    values = evaluator.evaluate([(n, p.detach()) for n, p in weights], version=1)
    assert set(values) == {"val/accuracy", "val/reward_mean", "val/pass_at_k"}
    assert evaluator.engine.version == 1 and 0.0 <= values["val/accuracy"] <= values["val/pass_at_k"] <= 1.0
    evaluator.close()


@pytest.mark.timeout(30)
def test_a_new_best_replaces_the_old_one_behind_a_relative_link_that_resume_never_takes_for_a_checkpoint(eval_run, tmp_path):
    from asyncflow.engines.hf import load_model

    weights = [(n, p.detach()) for n, p in load_model(eval_run.launch.model_dir).named_parameters()]
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_000002" / "DONE").write_text("2\n")
    save_best(tmp_path, weights, eval_run.launch.model_dir, 1, {"val/accuracy": 0.25, "val/reward_mean": 0.4})
    path = save_best(tmp_path, weights, eval_run.launch.model_dir, 3, {"val/accuracy": 0.5, "val/reward_mean": 0.6})
    link = tmp_path / "checkpoints" / "best"
    assert os.readlink(link) == "best_000004" and link.resolve() == path.resolve()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best", "best.json", "best_000004", "step_000002"]
    assert read_best(tmp_path) == {
        "step": 3,
        "version": 4,
        "metric": "val/accuracy",
        "value": 0.5,
        "path": "best_000004",
        "val/accuracy": 0.5,
        "val/reward_mean": 0.6,
    }
    assert latest_checkpoint(tmp_path).name == "step_000002"


@pytest.mark.timeout(10)
def test_the_progress_line_shows_the_val_accuracy_only_at_steps_that_evaluated():
    v = {
        "step": 3,
        "reward_mean": 0.5,
        "total_samples": 8,
        "total_tokens": 80,
        "time_s": 2.0,
        "staleness_max": 1,
        "response_len_mean": 3.0,
    }
    assert "val acc" not in progress_line(v, 10, {})
    assert "reward 0.500 | val acc 0.250 |" in progress_line({**v, "val/accuracy": 0.25}, 10, {})


@pytest.mark.timeout(30)
def test_plot_draws_a_held_out_accuracy_panel_when_a_run_has_evaluations(tmp_path):
    from asyncflow.cli.plot import draw

    rows = [
        {
            "step": s,
            "time_s": 1.0 + s,
            "step_time_s": 1.0,
            "samples": 4,
            "reward_mean": 0.1 * s,
            "response_len_mean": 3.0,
            "staleness_max": 1,
            **({"val/accuracy": 0.2 * s, "val/pass_at_k": 0.3 * s} if s % 2 else {}),
        }
        for s in range(4)
    ]
    draw([("run", rows)], tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000


@pytest.mark.timeout(10)
def test_an_impossible_eval_setting_names_the_key_and_the_fix(tmp_path):
    config = write_config(
        tmp_path, changes={"eval": {"every_steps": 2, "mode": "pass_at_k"}, "rollout.sampling": {"temperature": 0.0}}
    )
    with pytest.raises(ConfigError, match="eval.mode = 'pass_at_k': pass_at_k samples at rollout.sampling.temperature"):
        load_config(config)
    config = write_config(tmp_path, changes={"train.engine": {"lr_min_ratio": 2.0}})
    with pytest.raises(ConfigError, match="train.engine.lr_min_ratio = 2.0: out of range; use a value between 0 and 1"):
        load_config(config)


@pytest.mark.timeout(120)
def test_a_run_evaluates_every_n_steps_keeps_the_best_weights_and_never_trains_a_held_out_prompt(tmp_path):
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    schedule = {"lr": 1e-3, "lr_warmup_steps": 1, "lr_schedule": "cosine", "lr_min_ratio": 0.1}
    config = write_config(
        tmp_path,
        num_steps=3,
        changes={
            "eval": {"every_steps": 2, "num_prompts": 8, "at_start": True, "where": "trainer"},
            "train.engine": schedule,
            "data": {"num_prompts": 24},
        },
    )
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=110)
    assert proc.returncode == 0, out
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    # after the second step (metrics step 1) and after the last one (step 2)
    assert [int(m["step"]) for m in metrics if "val/accuracy" in m] == [1, 2]
    assert out.count("val acc") == 2 and "held-out accuracy: start" in out
    # eval.at_start: the starting weights' figures in the first step's record, equal to an evaluation of the base
    # model directory the same way (actors/evaluation/evaluator.evaluate_saved, what bench peer applies to TRL's weights)
    from asyncflow.actors.evaluation.evaluator import evaluate_saved

    start = metrics[0]["val/start_accuracy"]
    assert all("val/start_accuracy" not in m for m in metrics[1:])
    assert evaluate_saved(run_dir, run_dir / "model")["val/accuracy"] == start
    assert json.loads((run_dir / "summary.json").read_text())["val_start_accuracy"] == start
    assert [m["lr"] for m in metrics] == pytest.approx([lr_at(TrainEngineConfig(**schedule), k, 3) for k in range(3)])
    summary = json.loads((run_dir / "summary.json").read_text())
    evals = {int(m["step"]): m["val/accuracy"] for m in metrics if "val/accuracy" in m}
    assert summary["val_final_accuracy"] == evals[2]
    # each record says which version it evaluated, and what the model wrote is in eval_samples.jsonl
    assert [m["val/version"] for m in metrics if "val/accuracy" in m] == [2, 3]
    written = read_jsonl(run_dir / "eval_samples.jsonl")
    assert sorted({(r["step"], r["version"]) for r in written}) == [(0, 0), (1, 2), (2, 3)]
    assert all(len([r for r in written if r["version"] == v]) == 8 for v in (0, 2, 3))  # every held-out prompt
    accuracy = {v: sum(r["reward"] >= 0.999 for r in written if r["version"] == v) / 8 for v in (2, 3)}
    assert accuracy == {2: evals[1], 3: evals[2]}
    assert summary["val_best_accuracy"] == max(evals.values()) == evals[summary["val_best_step"] - 1]
    best = run_dir / "checkpoints" / "best"
    assert best.is_symlink() and not os.path.isabs(os.readlink(best))
    assert read_best(run_dir)["step"] + 1 == summary["val_best_step"]  # summary.json numbers steps as the console
    AutoModelForCausalLM.from_pretrained(best, local_files_only=True)
    assert latest_checkpoint(run_dir).name == "step_000003"
    # group g of the queue is group g % P of step g // P; the loader's pool is the training rows
    rows = read_prompts(str(run_dir / "data.jsonl"))
    train, heldout = split_prompts([r["prompt"] for r in rows], 8, seed=0)
    order = PromptOrder(len(train), 2, shuffle=True, seed=0)
    trained = {
        rows[train[order.index(*divmod(g, 2))]]["prompt"]
        for line in read_jsonl(run_dir / "trained.jsonl")
        for g in line["groups"]
    }
    assert len(trained) >= 3 and not trained & {rows[i]["prompt"] for i in heldout}


@pytest.mark.timeout(150)
def test_in_async_mode_an_evaluator_process_evaluates_while_the_trainer_goes_on(tmp_path):
    """eval.where = "auto" in async mode: the evaluator role evaluates each version it is
    asked for, fetched from the weights actor; the trainer never evaluates, and each
    record's val/version says which version its figures are of."""
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path,
        num_steps=3,
        changes={"eval": {"every_steps": 2, "num_prompts": 8, "at_start": True}, "data": {"num_prompts": 24}},
    )
    assert load_config(config).eval_in_process  # the tiny example is async
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=140)
    assert proc.returncode == 0, out
    assert "evaluator" in out  # started as a process of its own
    evals = read_jsonl(run_dir / "eval.jsonl")
    versions = [int(e["version"]) for e in evals]
    # the start weights and the last version; version 2 too unless it was no longer staged when the evaluator
    # got to it (it evaluates the newest then, and skips a request for a version it has evaluated already)
    assert versions in ([0, 2, 3], [0, 3]), versions
    by_version = {int(e["version"]): e for e in evals}
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    # the last record waits for the last evaluation; an earlier one reaches the first record after it is done
    assert metrics[-1]["val/version"] == 3 and metrics[-1]["val/accuracy"] == by_version[3]["val/accuracy"]
    assert all(by_version[int(m["val/version"])]["val/accuracy"] == m["val/accuracy"] for m in metrics if "val/accuracy" in m)
    starts = [m["val/start_accuracy"] for m in metrics if "val/start_accuracy" in m]
    assert starts == [by_version[0]["val/accuracy"]]
    # the start weights are the model directory's, evaluated as the trainer would
    from asyncflow.actors.evaluation.evaluator import evaluate_saved

    assert evaluate_saved(run_dir, run_dir / "model")["val/accuracy"] == starts[0]
    written = read_jsonl(run_dir / "eval_samples.jsonl")
    assert sorted({(r["step"], r["version"]) for r in written}) == [(v - 1 if v else 0, v) for v in versions]
    best = read_best(run_dir)
    assert best["value"] == max(by_version[v]["val/accuracy"] for v in versions if v)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["val_final_accuracy"] == by_version[3]["val/accuracy"] and summary["val_start_accuracy"] == starts[0]
    # the trainer's time has no evaluation in it: the evaluator's has all of it
    spans = read_jsonl(run_dir / "trace" / "spans.jsonl") if (run_dir / "trace" / "spans.jsonl").exists() else None
    busy = summary["busy_fraction"]
    assert "evaluator" in busy, busy
    if spans is not None:
        assert not [s for s in spans if s.get("role") == "trainer" and s.get("name") == "eval"]


@pytest.mark.timeout(30)
def test_eval_at_start_is_refused_without_evaluation_or_with_several_trainer_ranks():
    from asyncflow.config.load import load_config_text

    with pytest.raises(ConfigError, match="at_start"):
        load_config_text("[eval]\nat_start = true")
    with pytest.raises(ConfigError, match="num_ranks"):
        load_config_text("[eval]\nevery_steps = 5\nat_start = true\n[train]\nnum_ranks = 2\n[train.engine]\nfsdp = true")
    assert load_config_text("[eval]\nevery_steps = 5\nat_start = true").eval.at_start


ENV_FIGURES = {
    "val/env/tool_call_rate",
    "val/env/tool_calls_mean",
    "val/env/error_rate",
    "val/env/reward_mean",
    "val/env/model_token_frac",
}
"""The environment's figures of an evaluation with ``[env] path`` (training's env/*, under val/)."""


@pytest.fixture(scope="module")
def calc_run(tmp_path_factory):
    """A run directory of the calc tool task (docs/environments.md): untrained tiny model, the
    environment's reward only, [eval] on."""
    from tiny_config import tiny_config_text

    from asyncflow.actors.driver.prepare import prepare_new
    from asyncflow.config.load import load_config_text

    changes = {
        "data": {"task": "calc"},
        "env": {"path": "asyncflow.envs.calc:CalcEnv", "max_turns": 3, "reward": "replace"},
        "reward": {"functions": []},
        "rollout.sampling": {"max_new_tokens": 24, "temperature": 1.0},
        "eval": {"every_steps": 1, "num_prompts": 5},
    }
    root = tmp_path_factory.mktemp("calcrun")
    _, rd, _ = prepare_new(load_config_text(tiny_config_text(changes)), root / "run")
    return Run(rd)


class ToolUser:
    """Stands in for the rollout engine as a model that has learnt the calc tool: to a
    context ending with the prompt ``a*b=`` it answers ``<calc>a*b</calc>``, to one
    ending with a tool result it answers that result. Keeps the contexts it was given."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.contexts: list[str] = []

    def load_weights(self, named_tensors, version):
        self.version = version

    def close(self):
        """Nothing held."""

    def generate(self, prompts, params):
        assert params.n == 1  # the driver gives each trajectory's context once
        out = []
        for p, ids in enumerate(prompts):
            context = self.tokenizer.decode(ids, skip_special_tokens=True)
            self.contexts.append(context)
            text = f"<calc>{context[:-1]}</calc>" if context.endswith("=") else context.rsplit("</calc>", 1)[1]
            response = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append(Completion(p, 0, response, [0.0] * len(response), "stop", self.version))
        return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["greedy", "pass_at_k"])
def test_with_an_environment_the_evaluation_runs_the_episodes_and_the_tools_result_is_in_the_transcript(calc_run, mode):
    run = Run(calc_run.dir)
    run.config = msgspec.structs.replace(run.config, eval=msgspec.structs.replace(run.config.eval, mode=mode, k=2))
    evaluator = Evaluator(run)
    evaluator.engine = engine = ToolUser(evaluator.tokenizer)
    try:
        values = evaluator.evaluate([], version=3)
    finally:
        evaluator.close()
    samples = 2 if mode == "pass_at_k" else 1
    # turn 1 of every episode sees its prompt; turn 2 sees the call and the calc tool's result (never the engine's)
    for prompt, answer in zip(evaluator.prompts, evaluator.answers):
        expr = prompt.rstrip("=")
        assert engine.contexts.count(prompt) == samples
        assert engine.contexts.count(f"{prompt}<calc>{expr}</calc>{answer}") == samples
    assert len(engine.contexts) == 2 * samples * len(evaluator.prompts)
    # scored by the environment (env.reward = "replace", no reward functions): every final answer is the product
    assert values["val/accuracy"] == values["val/reward_mean"] == 1.0
    assert values["val/env/tool_call_rate"] == values["val/env/tool_calls_mean"] == values["val/env/reward_mean"] == 1.0
    assert values["val/env/error_rate"] == 0.0 and 0.0 < values["val/env/model_token_frac"] < 1.0
    assert set(values) == {"val/accuracy", "val/reward_mean", *ENV_FIGURES} | ({"val/pass_at_k"} if samples > 1 else set())


@pytest.mark.timeout(60)
def test_the_evaluations_own_engine_drives_an_untrained_model_through_every_turn_of_the_environment(calc_run):
    from asyncflow.engines.hf import load_model

    run = Run(calc_run.dir)
    run.config = msgspec.structs.replace(run.config, env=msgspec.structs.replace(run.config.env, path="wf_envs:TwoTurnEnv"))
    evaluator = Evaluator(run)
    weights = [(n, p.detach()) for n, p in load_model(run.launch.model_dir).named_parameters()]
    try:
        values = evaluator.evaluate(weights, version=2)
        assert evaluator.engine.version == 2
    finally:
        evaluator.close()
    # TwoTurnEnv: a tool call, then reward 1 at the second turn, whatever the model says (a single turn would score 0)
    assert values["val/accuracy"] == values["val/env/tool_call_rate"] == values["val/env/reward_mean"] == 1.0
    assert values["val/env/error_rate"] == 0.0 and 0.0 < values["val/env/model_token_frac"] < 1.0


@pytest.mark.timeout(150)
def test_a_run_with_an_environment_evaluates_multi_turn_episodes_into_metrics(tmp_path):
    here = Path(__file__).resolve().parent
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path,
        num_steps=2,
        changes={
            "env": {"path": "wf_envs:TwoTurnEnv", "max_turns": 3, "reward": "replace"},
            "reward": {"functions": []},
            "eval": {"every_steps": 1, "num_prompts": 4, "where": "trainer"},  # each step's record has its own figures
        },
        extra=f'\n[cluster]\npython_path = ["{here}"]\n',
    )
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=140)
    assert proc.returncode == 0, out
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [int(m["step"]) for m in metrics] == [0, 1]
    for m in metrics:  # every step evaluated: the held-out episodes took both turns of TwoTurnEnv
        assert m["val/accuracy"] == m["val/env/tool_call_rate"] == m["val/env/reward_mean"] == 1.0, m
        assert m["val/env/error_rate"] == 0.0 and 0.0 < m["val/env/model_token_frac"] < 1.0, m
        assert m["env/tool_call_rate"] == 1.0, m  # training's episodes, the same environment
