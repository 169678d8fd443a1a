"""``afctl plan --config RUN.toml --profile P``: the predicted time per step of a run
config on this machine, sync and async, from a calibrated profile.

Maps the config onto the planner: the model (its HF config, or the tiny model the run
would build), the mean prompt length (its prompts, tokenized as the loader does),
responses of ``max_new_tokens`` (or ``--response-len``), one generate call of
``prompts_per_call x group_size`` sequences per unit, the trainer's threads as its
devices. Stage times come from the cost model (`planner.cost`), the step from playing
out the workflow (`planner.workflow`: units, the staleness gate, the rollout's poll,
processes sharing cores). ``--compare DIR`` reads the summaries of
``afctl bench e2e --out DIR`` and prints the prediction errors.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import click
import msgspec

ROLLOUT_POLL_S = 0.05  # the rollout's blocking get_batch timeout when its next rows are gated (actors/rollout.py)


def mean_prompt_tokens(cfg, model_dir: str, limit: int = 500) -> float:
    """Mean prompt length in tokens, the way the loader encodes prompts."""
    from asyncflow.engines.hf import load_tokenizer
    from asyncflow.engines.tiny import encode_chat_prompt

    if cfg.data.path:
        from asyncflow.actors._run import read_prompts

        prompts = [r["prompt"] for r in read_prompts(cfg.data.path)[:limit]]
    else:
        from asyncflow.algorithms.tasks import make_examples

        prompts = [r["prompt"] for r in make_examples(min(limit, cfg.data.num_prompts), seed=cfg.data.seed, task=cfg.data.task)]
    tok = load_tokenizer(model_dir)
    lens = [len(encode_chat_prompt(tok, p) if cfg.data.chat_template else tok(p, add_special_tokens=False)["input_ids"])
            for p in prompts]
    return sum(lens) / len(lens)


def model_dir_of(cfg, scratch: Path) -> str:
    """The model the run would use: model.path, or the tiny model's config and tokenizer (no weights)."""
    if cfg.model.path:
        return cfg.model.path
    from asyncflow.engines.tiny import build_char_tokenizer, tiny_config

    tiny_config(cfg.model.tiny).to_json_file(str(scratch / "config.json"))
    build_char_tokenizer().save_pretrained(str(scratch))
    return str(scratch)


def predict(cfg, profile, response_len: float | None = None, num_steps: int = 20, cores: int | None = None) -> dict:
    """Predicted seconds per step of `cfg` in sync and async mode, with the stage times."""
    from asyncflow.planner import cost, workflow
    from asyncflow.planner.hardware import get_hardware
    from asyncflow.planner.models import from_hf_config

    hw = get_hardware(profile.hardware)
    eff = profile.efficiency
    cores = cores or os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = model_dir_of(cfg, Path(scratch))
        model = from_hf_config(model_dir)
        prompt = mean_prompt_tokens(cfg, model_dir)
    G = cfg.algorithm.group_size
    cap = cfg.rollout.sampling.max_new_tokens
    resp = response_len or cap
    batch = cfg.rollout.prompts_per_call * G
    wl = cost.Workload(
        prompt_len_tokens=max(1, round(prompt)), response_len_tokens=max(1, round(resp)), max_response_len_tokens=cap,
        prompts_per_step=cfg.train.prompts_per_step, samples_per_prompt=G, use_reference=cfg.algorithm.kl_coef > 0,
        use_critic=cfg.algorithm.name == "ppo",
    )
    # one call: a static batch, prefilled once, decoded until its longest sample ends (the cap)
    prefill_s = (batch * model.prefill_flops(wl.prompt_len_tokens) / (hw.peak_bf16_flops * eff.prefill_flops)
                 + model.num_layers * eff.prefill_overhead_s_per_layer)
    decode_s = cap * cost.decode_iteration_s(model, hw, eff, 1, batch, prompt + cap / 2)
    threads = cfg.cluster.threads_per_process
    train_threads = (cfg.planner.train_threads or threads) if cfg.planner.online else threads
    train = cost.train_cost(model, hw, eff, wl, train_threads, 1, 1)
    ref = cost.forward_cost(model, hw, eff, wl, threads, 1) if wl.use_reference else None
    transfer_s = cost.weight_transfer_s(model, hw, eff, 1)
    replicas = cfg.rollout.num_replicas
    rollout_workers = replicas * threads
    C = workflow.calls_per_step(cfg.train.prompts_per_step, cfg.rollout.prompts_per_call)
    out = {"model": model.name, "num_params": model.num_params, "prompt_tokens": prompt, "response_tokens": resp,
           "calls_per_step": C, "call_batch": batch, "cores": cores, "modes": {}}
    for mode, k in (("sync", 0), ("async", cfg.workflow.staleness)):
        # processes share the cores: in sync the phases take turns, in async rollout and training overlap
        f_roll = workflow.contention(rollout_workers if mode == "sync" else rollout_workers + train_threads, cores)
        f_train = workflow.contention(train_threads if mode == "sync" else rollout_workers + train_threads, cores)
        st = workflow.StageTimes(
            call_s=(prefill_s + decode_s) * f_roll, calls_per_step=C, train_s=train.time_s * f_train,
            publish_s=transfer_s, fetch_s=transfer_s, swap_s=cost.weight_swap_s(model, hw, 1),
            reward_s=(ref.time_s if mode == "sync" else ref.latency_s) if ref else 0.0, poll_s=ROLLOUT_POLL_S,
        )
        sim = workflow.simulate(st, replicas, k, num_steps)
        out["modes"][mode] = {
            "predicted_step_s": sim.step_s, "predicted_samples_per_s": wl.num_samples / sim.step_s,
            "stages": msgspec.to_builtins(st), "contention": {"rollout": f_roll, "train": f_train},
            "num_polls": sim.num_polls, "staleness": k,
            # the analytical bound without the workflow's mechanics, for comparison
            "analytical_step_s": (cost.sync_step(_role(C * st.call_s / replicas, replicas), _role(st.train_s, 1), None, transfer_s)
                                  if k == 0 else cost.async_step(_role(C * st.call_s / replicas, replicas),
                                                                 _role(st.train_s, 1), None, transfer_s, st.swap_s, k)).step_s,
        }
    return out


def _role(time_s: float, devices: int):
    from asyncflow.planner.cost import RoleCost

    return RoleCost(role="", devices=devices, time_s=time_s, latency_s=time_s)


def compare(pred: dict, e2e_dir: str, samples_per_step: int) -> dict:
    """Measured step times from ``afctl bench e2e --out DIR`` beside the predictions."""
    out = {}
    for mode, p in pred["modes"].items():
        summary = json.loads((Path(e2e_dir) / mode / "summary.json").read_text())
        measured = samples_per_step / summary["samples_per_s"]
        out[mode] = {"measured_step_s": measured, "predicted_step_s": p["predicted_step_s"],
                     "error": p["predicted_step_s"] / measured - 1}
    return out


def run_predict(config_path: str, profile_path: str | None, response_len: float | None, steps: int,
                compare_dir: str | None, as_json: bool) -> None:
    from asyncflow.core.config import load_config
    from asyncflow.planner.calibration import Profile, load_profile

    if not profile_path:
        raise click.UsageError("--config needs --profile FILE (calibrate first: afctl profile --out FILE)")
    cfg = load_config(config_path)
    profile: Profile = load_profile(profile_path)
    pred = predict(cfg, profile, response_len=response_len, num_steps=steps)
    measured = compare(pred, compare_dir, cfg.samples_per_step) if compare_dir else None
    if as_json:
        sys.stdout.write(json.dumps({"prediction": pred, "comparison": measured}) + "\n")
        return
    click.echo(f"{config_path}: {pred['model']} ({pred['num_params'] / 1e6:.2f} M params), prompt {pred['prompt_tokens']:.1f} "
               f"+ response {pred['response_tokens']:.1f} tokens, {pred['calls_per_step']} generate calls of "
               f"{pred['call_batch']} sequences per step, {pred['cores']} cores; profile {profile_path}")
    for mode, p in pred["modes"].items():
        st = p["stages"]
        click.echo(f"  {mode:<5} (k={p['staleness']}): {p['predicted_step_s']:.3f} s/step, {p['predicted_samples_per_s']:.1f} samples/s"
                   f"  [call {st['call_s'] * 1e3:.1f} ms x {st['calls_per_step']}, train {st['train_s'] * 1e3:.1f} ms, "
                   f"{p['num_polls']} polls of {st['poll_s']:.2f} s, contention x{p['contention']['rollout']:.2f}; "
                   f"without the workflow's mechanics {p['analytical_step_s']:.3f} s]")
    if measured:
        for mode, m in measured.items():
            click.echo(f"  {mode:<5} measured {m['measured_step_s']:.3f} s/step: prediction error {m['error']:+.0%}")
