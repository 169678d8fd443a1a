"""``afctl plan --config RUN.toml --profile P``: the predicted time per step of a run
config on this machine, sync and async, from a calibrated profile.

The prediction itself is `asyncflow.planner.predict` (pure). This module measures
what only the config's model and data can tell (`config_inputs`): the model (its HF
config, or the tiny model the run would build), the mean prompt length (its prompts,
tokenized as the loader does) and the seconds its reward functions take; then prints.
Responses are ``max_new_tokens`` long (or ``--response-len``). ``--compare DIR``
reads the summaries of ``afctl bench e2e --out DIR`` and prints the prediction errors.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import click

from asyncflow.planner.predict import ConfigInputs
from asyncflow.planner.predict import predict as planner_predict


def mean_prompt_tokens(cfg, model_dir: str, limit: int = 500) -> float:
    """Mean prompt length in tokens, the way the loader encodes prompts."""
    from asyncflow.engines.hf import load_tokenizer
    from asyncflow.engines.prompts import prompt_ids

    if cfg.data.path:
        from asyncflow.actors.runtime.run_dir import read_prompts

        prompts = [r["prompt"] for r in read_prompts(cfg.data.path)[:limit]]
    else:
        from asyncflow.toy.tasks import make_examples

        prompts = [r["prompt"] for r in make_examples(min(limit, cfg.data.num_prompts), seed=cfg.data.seed, task=cfg.data.task)]
    tok = load_tokenizer(model_dir)
    lens = [len(prompt_ids(tok, p, cfg.data.chat_template)) for p in prompts]
    return sum(lens) / len(lens)


def reward_score_s(cfg, model_dir: str, rows: int, limit: int = 64) -> float:
    """Seconds the reward actor spends scoring `rows` rows of this config (actors/roles/reward.py):
    decode prompts and responses, call the configured functions. Timed here on the
    config's own prompts, with their reference answers as responses."""
    import time

    from asyncflow.actors.runtime.scoring import build_reward_fn
    from asyncflow.algorithms.rewards import call_reward
    from asyncflow.engines.hf import load_tokenizer

    if not cfg.reward.functions:
        return 0.0
    if cfg.data.path:
        from asyncflow.actors.runtime.run_dir import read_prompts

        examples = read_prompts(cfg.data.path)[:limit]
    else:
        from asyncflow.toy.tasks import make_examples

        examples = make_examples(min(limit, cfg.data.num_prompts), seed=cfg.data.seed, task=cfg.data.task)
    tok = load_tokenizer(model_dir)
    fn = build_reward_fn(cfg.reward.functions, cfg.reward.weights)
    ids = [
        (
            tok(str(r["prompt"]), add_special_tokens=False)["input_ids"],
            tok(str(r.get("answer", "")), add_special_tokens=False)["input_ids"],
        )
        for r in examples
    ]
    answers = [str(r.get("answer", "")) for r in examples]
    batch = [ids[i % len(ids)] for i in range(rows)]

    def score() -> None:
        prompts = [tok.decode(p, skip_special_tokens=True) for p, _ in batch]
        responses = [tok.decode(r, skip_special_tokens=True) for _, r in batch]
        call_reward(fn, prompts, responses, [answers[i % len(answers)] for i in range(rows)], ["stop"] * rows)

    times = []
    for _ in range(4):
        start = time.perf_counter()
        score()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[1]  # the median of three, after a warm-up


def model_dir_of(cfg, scratch: Path) -> str:
    """The model the run would use: model.path, or the tiny model's config and tokenizer (no weights)."""
    if cfg.model.path:
        return cfg.model.path
    from asyncflow.toy.tiny import build_char_tokenizer, tiny_config

    tiny_config(cfg.model.tiny).to_json_file(str(scratch / "config.json"))
    build_char_tokenizer().save_pretrained(str(scratch))
    return str(scratch)


def reward_model_shape(cfg, model_dir: str):
    """The shape of the ``[reward_model]`` role's model (None without it): its path, the
    tiny reward model's config, or the policy's (a judge without a path)."""
    from asyncflow.planner.io import from_hf_config, shape_from_hf_config

    rm = cfg.reward_model
    if not rm.enabled:
        return None
    if rm.path:
        return from_hf_config(rm.path)
    if rm.kind == "judge":
        return from_hf_config(model_dir)
    from asyncflow.toy.tiny import tiny_config

    return shape_from_hf_config(tiny_config(cfg.model.tiny).to_dict(), name="tiny reward model", source="toy.tiny")


def config_inputs(cfg) -> ConfigInputs:
    """The config's model shape, mean prompt length and reward timing, measured here."""
    from asyncflow.planner.io import from_hf_config

    with tempfile.TemporaryDirectory() as scratch:
        model_dir = model_dir_of(cfg, Path(scratch))
        G = cfg.algorithm.group_size
        return ConfigInputs(
            model=from_hf_config(model_dir),
            reward_model=reward_model_shape(cfg, model_dir),
            prompt_tokens=mean_prompt_tokens(cfg, model_dir),
            # sync: one unit scores the whole step; async: units as rows come (one call's at most)
            reward_score_s={
                "sync": reward_score_s(cfg, model_dir, cfg.rows_per_step),
                "async": reward_score_s(cfg, model_dir, min(cfg.reward.batch_size or 1 << 30, cfg.rollout.prompts_per_call * G)),
            },
        )


def predict(
    cfg,
    profile,
    response_len: float | None = None,
    num_steps: int = 20,
    cores: int | None = None,
    longest_response_len: float | None = None,
) -> dict:
    """`planner.predict.predict` of `cfg` with its inputs measured here (`config_inputs`)
    on this machine's cores (or `cores`)."""
    from asyncflow.actors.rollout import ANNOUNCE_WAIT_S

    return planner_predict(
        cfg,
        profile,
        config_inputs(cfg),
        cores=cores or os.cpu_count() or 1,
        response_len=response_len,
        num_steps=num_steps,
        longest_response_len=longest_response_len,
        poll_s=ANNOUNCE_WAIT_S,
    )


def compare(pred: dict, e2e_dir: str, samples_per_step: int) -> dict:
    """Measured step times from ``afctl bench e2e --out DIR`` beside the predictions."""
    out = {}
    for mode, p in pred["modes"].items():
        summary = json.loads((Path(e2e_dir) / mode / "summary.json").read_text())
        measured = samples_per_step / summary["samples_per_s"]
        out[mode] = {
            "measured_step_s": measured,
            "predicted_step_s": p["predicted_step_s"],
            "error": p["predicted_step_s"] / measured - 1,
        }
        metrics = Path(e2e_dir) / mode / "metrics.jsonl"
        if metrics.exists():  # the workload the run had: its policy's mean response length
            lens = [json.loads(line).get("response_len_mean") for line in metrics.read_text().splitlines() if line.strip()]
            lens = [x for x in lens if x is not None]
            if lens:
                out[mode]["measured_response_len"] = sum(lens) / len(lens)
    return out


def run_predict(
    config_path: str,
    profile_path: str | None,
    response_len: float | None,
    steps: int,
    compare_dir: str | None,
    as_json: bool,
    longest_response_len: float | None = None,
) -> None:
    from asyncflow.config.load import load_config
    from asyncflow.planner.calibration import Profile
    from asyncflow.planner.io import load_profile

    if not profile_path:
        raise click.UsageError("--config needs --profile FILE (calibrate first: afctl profile --out FILE)")
    cfg = load_config(config_path)
    profile: Profile = load_profile(profile_path)
    pred = predict(cfg, profile, response_len=response_len, num_steps=steps, longest_response_len=longest_response_len)
    measured = compare(pred, compare_dir, cfg.samples_per_step) if compare_dir else None
    if as_json:
        sys.stdout.write(json.dumps({"prediction": pred, "comparison": measured}) + "\n")
        return
    click.echo(
        f"{config_path}: {pred['model']} ({pred['num_params'] / 1e6:.2f} M params), prompt {pred['prompt_tokens']:.1f} "
        f"+ response {pred['response_tokens']:.1f} tokens (longest of a call {pred['longest_response_tokens']:.1f}), "
        f"{pred['calls_per_step']} generate calls of {pred['call_batch']} sequences per step, {pred['cores']} cores; "
        f"profile {profile_path}"
    )
    c, fw = pred["call"], pred["framework"]
    click.echo(
        f"  call: overhead {c['overhead_s'] * 1e3:.1f} + prefill {c['prefill_s'] * 1e3:.1f} + decode {c['decode_s'] * 1e3:.1f} ms "
        f"({c['iterations']:.1f} iterations) + queue {fw['call_queue_s'] * 1e3:.1f} ms; trainer: engine "
        f"{pred['engine_train_s'] * 1e3:.1f} + own work {fw['trainer_s'] * 1e3:.1f} + queue {fw['trainer_queue_s'] * 1e3:.1f} "
        f"+ snapshot {fw['snapshot_s'] * 1e3:.1f} + publish {fw['publish_asks_s'] * 1e3:.1f} ms; reward: score "
        f"{fw['reward_score_s']['sync'] * 1e3:.1f} (sync) / {fw['reward_score_s']['async'] * 1e3:.1f} (async) + queue "
        f"{fw['reward_queue_s'] * 1e3:.1f} + hand-offs {fw['handoffs_s'] * 1e3:.1f} ms"
    )
    for mode, p in pred["modes"].items():
        st = p["stages"]
        click.echo(
            f"  {mode:<5} (k={p['staleness']}): {p['predicted_step_s']:.3f} s/step, {p['predicted_samples_per_s']:.1f} samples/s"
            f"  [call {st['call_s'] * 1e3:.1f} ms x {st['calls_per_step']}, train {st['train_s'] * 1e3:.1f} ms, "
            f"{p['num_polls']} polls of {st['poll_s']:.2f} s, "
            f"contention x{p['contention']['rollout']:.2f}/x{p['contention']['train']:.2f}; "
            f"without the workflow's mechanics {p['analytical_step_s']:.3f} s]"
        )
    o = pred["other_rollout_mode"]
    how = (
        "workflow.partial_rollout: one stream, rows refilled as they free"
        if pred["rollout_mode"] == "stream"
        else "generate calls, each waiting for its longest response"
    )
    click.echo(
        f"  async assumes the config's rollout mode, {pred['rollout_mode']} ({how}); {o['rollout_mode']} would give "
        f"{o['predicted_step_s']:.3f} s/step, {o['predicted_samples_per_s']:.1f} samples/s"
    )
    if measured:
        for mode, m in measured.items():
            resp = f" (its responses: {m['measured_response_len']:.1f} tokens on average)" if "measured_response_len" in m else ""
            click.echo(f"  {mode:<5} measured {m['measured_step_s']:.3f} s/step: prediction error {m['error']:+.0%}{resp}")
