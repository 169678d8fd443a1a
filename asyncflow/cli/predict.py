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

ROLLOUT_POLL_S = 0.05  # how long a gated rollout waits before it looks again (actors/rollout.py)
ROLLOUT_WAKES_ON_ANNOUNCE = True  # its wait ends at WeightsReady (since 51cadc0; before, a blocking get slept through it)


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


def reward_score_s(cfg, model_dir: str, rows: int, limit: int = 64) -> float:
    """Seconds the reward actor spends scoring `rows` rows of this config (actors/reward.py):
    decode prompts and responses, call the configured functions. Timed here on the
    config's own prompts, with their reference answers as responses."""
    import time

    from asyncflow.actors.reward import build_reward_fn
    from asyncflow.algorithms.rewards import call_reward
    from asyncflow.engines.hf import load_tokenizer

    if not cfg.reward.functions:
        return 0.0
    if cfg.data.path:
        from asyncflow.actors._run import read_prompts

        examples = read_prompts(cfg.data.path)[:limit]
    else:
        from asyncflow.algorithms.tasks import make_examples

        examples = make_examples(min(limit, cfg.data.num_prompts), seed=cfg.data.seed, task=cfg.data.task)
    tok = load_tokenizer(model_dir)
    fn = build_reward_fn(cfg.reward.functions, cfg.reward.weights)
    ids = [(tok(str(r["prompt"]), add_special_tokens=False)["input_ids"], tok(str(r.get("answer", "")), add_special_tokens=False)["input_ids"])
           for r in examples]
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
    from asyncflow.engines.tiny import build_char_tokenizer, tiny_config

    tiny_config(cfg.model.tiny).to_json_file(str(scratch / "config.json"))
    build_char_tokenizer().save_pretrained(str(scratch))
    return str(scratch)


def predict(cfg, profile, response_len: float | None = None, num_steps: int = 20, cores: int | None = None,
            longest_response_len: float | None = None) -> dict:
    """Predicted seconds per step of `cfg` in sync and async mode, with the stage times.

    `response_len`: mean response (default: the cap, or the longest if given);
    `longest_response_len`: the longest response of a generate call (default: the cap)."""
    from asyncflow.planner import cost, framework, workflow
    from asyncflow.planner.hardware import get_hardware
    from asyncflow.planner.models import from_hf_config

    hw = get_hardware(profile.hardware)
    eff = profile.efficiency
    cores = cores or os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = model_dir_of(cfg, Path(scratch))
        model = from_hf_config(model_dir)
        prompt = mean_prompt_tokens(cfg, model_dir)
        G0 = cfg.algorithm.group_size
        # sync: one unit scores the whole step; async: units as rows come (one call's at most)
        score_s = {"sync": reward_score_s(cfg, model_dir, cfg.samples_per_step),
                   "async": reward_score_s(cfg, model_dir, min(cfg.reward.batch_size or 1 << 30, cfg.rollout.prompts_per_call * G0))}
    G = cfg.algorithm.group_size
    cap = cfg.rollout.sampling.max_new_tokens
    longest = min(cap, longest_response_len or cap)
    resp = min(response_len or longest, longest)
    batch = cfg.rollout.prompts_per_call * G
    wl = cost.Workload(
        prompt_len_tokens=max(1, round(prompt)), response_len_tokens=max(1, round(resp)), max_response_len_tokens=cap,
        prompts_per_step=cfg.train.prompts_per_step, samples_per_prompt=G, use_reference=cfg.algorithm.kl_coef > 0,
        use_critic=cfg.algorithm.name == "ppo",
    )
    # one call: a static batch, prefilled once, decoded until its longest sample ends; finished samples leave the batch
    call = framework.generate_call(model, hw, eff, batch, prompt, resp, longest)
    threads = cfg.cluster.threads_per_process
    train_threads = (cfg.planner.train_threads or threads) if cfg.planner.online else threads
    # the engine trains the right-padded batch: every row as long as prompt + the longest response
    padded = msgspec.structs.replace(wl, response_len_tokens=max(1, round(longest)))
    train = cost.train_cost(model, hw, eff, padded, train_threads, 1, 1)
    ref = cost.forward_cost(model, hw, eff, padded, threads, 1) if wl.use_reference else None
    transfer_s = cost.weight_transfer_s(model, hw, eff, 1)
    replicas = cfg.rollout.num_replicas
    rollout_workers = replicas * threads
    C = workflow.calls_per_step(cfg.train.prompts_per_step, cfg.rollout.prompts_per_call)
    S = wl.num_samples
    # the framework's own work per unit (afctl profile: trainer rows, weight snapshot, queue asks)
    framework_s = {
        "call_queue_s": framework.queue_s(eff, framework.ROLLOUT_CALL_ASKS, batch),
        "trainer_s": framework.trainer_extra_s(eff, S),
        "trainer_queue_s": framework.queue_s(eff, framework.TRAINER_STEP_ASKS, S),
        "snapshot_s": framework.snapshot_s(eff, model.num_params),
        "publish_asks_s": framework.queue_s(eff, framework.PUBLISH_ASKS, 0),
        "reward_queue_s": framework.queue_s(eff, framework.REWARD_UNIT_ASKS, batch),
        # rollout's put -> the reward wakes; the reward's put -> the trainer wakes
        "handoffs_s": 2 * eff.queue_handoff_s,
        "reward_score_s": score_s,
    }
    out = {"model": model.name, "num_params": model.num_params, "prompt_tokens": prompt, "response_tokens": resp,
           "longest_response_tokens": longest, "calls_per_step": C, "call_batch": batch, "cores": cores,
           "call": {**msgspec.to_builtins(call), "time_s": call.time_s}, "engine_train_s": train.time_s,
           "framework": framework_s, "modes": {}}
    for mode, k in (("sync", 0), ("async", cfg.workflow.staleness)):
        # processes share the cores: in sync the phases take turns (stretched only beyond the cores); in
        # async a stage shares the cores with the other side and the reward and queue processes as far as
        # they are runnable (time slices), and runs slower while the other core computes (corun_slowdown,
        # measured by afctl profile): stretches from the simulated busy fractions, iterated to a fixed point
        f_roll = workflow.contention(rollout_workers, cores) if mode == "sync" else 1.0
        f_train = workflow.contention(train_threads, cores) if mode == "sync" else 1.0
        s_roll = s_train = 1.0 if mode == "sync" else workflow.contention(rollout_workers + train_threads, cores)
        for _ in range(8 if mode == "async" else 1):
            st = workflow.StageTimes(
                call_s=call.time_s * f_roll * s_roll + framework_s["call_queue_s"], calls_per_step=C,
                train_s=(train.time_s + framework_s["trainer_s"]) * f_train * s_train + framework_s["trainer_queue_s"],
                publish_s=transfer_s + framework_s["snapshot_s"] * f_train * s_train + framework_s["publish_asks_s"],
                fetch_s=transfer_s + framework.queue_s(eff, framework.FETCH_ASKS, 0),
                swap_s=cost.weight_swap_s(model, hw, 1) + framework.queue_s(eff, framework.SWAP_ASKS, 0),
                reward_s=((ref.time_s if mode == "sync" else ref.latency_s) if ref else 0.0) + framework_s["reward_queue_s"]
                + framework_s["handoffs_s"] + score_s[mode],
                poll_s=ROLLOUT_POLL_S + framework.queue_s(eff, framework.POLL_ASKS, 0),
                wake_on_announce=ROLLOUT_WAKES_ON_ANNOUNCE,
            )
            sim = workflow.simulate(st, replicas, k, num_steps)
            used = (s_roll, s_train)
            if mode == "async":
                # the other side, and the reward and queue processes, runnable part of the time beside a stage
                aux = [v / sim.step_s for v in framework.aux_cpu_s(eff, C, score_s["async"]).values()]
                s_roll = (framework.corun_stretch(eff, sim.train_busy)
                          * framework.shared_core_stretch([sim.train_busy] * train_threads
                                                          + [sim.rollout_busy] * (rollout_workers - 1) + aux, cores))
                s_train = (framework.corun_stretch(eff, sim.rollout_busy)
                           * framework.shared_core_stretch([sim.rollout_busy] * rollout_workers
                                                           + [sim.train_busy] * (train_threads - 1) + aux, cores))
        out["modes"][mode] = {
            "predicted_step_s": sim.step_s, "predicted_samples_per_s": wl.num_samples / sim.step_s,
            "stages": msgspec.to_builtins(st), "contention": {"rollout": f_roll * used[0], "train": f_train * used[1]},
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
        metrics = Path(e2e_dir) / mode / "metrics.jsonl"
        if metrics.exists():  # the workload the run had: its policy's mean response length
            lens = [json.loads(line).get("response_len_mean") for line in metrics.read_text().splitlines() if line.strip()]
            lens = [x for x in lens if x is not None]
            if lens:
                out[mode]["measured_response_len"] = sum(lens) / len(lens)
    return out


def run_predict(config_path: str, profile_path: str | None, response_len: float | None, steps: int,
                compare_dir: str | None, as_json: bool, longest_response_len: float | None = None) -> None:
    from asyncflow.core.config import load_config
    from asyncflow.planner.calibration import Profile, load_profile

    if not profile_path:
        raise click.UsageError("--config needs --profile FILE (calibrate first: afctl profile --out FILE)")
    cfg = load_config(config_path)
    profile: Profile = load_profile(profile_path)
    pred = predict(cfg, profile, response_len=response_len, num_steps=steps, longest_response_len=longest_response_len)
    measured = compare(pred, compare_dir, cfg.samples_per_step) if compare_dir else None
    if as_json:
        sys.stdout.write(json.dumps({"prediction": pred, "comparison": measured}) + "\n")
        return
    click.echo(f"{config_path}: {pred['model']} ({pred['num_params'] / 1e6:.2f} M params), prompt {pred['prompt_tokens']:.1f} "
               f"+ response {pred['response_tokens']:.1f} tokens (longest of a call {pred['longest_response_tokens']:.1f}), "
               f"{pred['calls_per_step']} generate calls of {pred['call_batch']} sequences per step, {pred['cores']} cores; "
               f"profile {profile_path}")
    c, fw = pred["call"], pred["framework"]
    click.echo(f"  call: overhead {c['overhead_s'] * 1e3:.1f} + prefill {c['prefill_s'] * 1e3:.1f} + decode {c['decode_s'] * 1e3:.1f} ms "
               f"({c['iterations']:.1f} iterations) + queue {fw['call_queue_s'] * 1e3:.1f} ms; trainer: engine "
               f"{pred['engine_train_s'] * 1e3:.1f} + own work {fw['trainer_s'] * 1e3:.1f} + queue {fw['trainer_queue_s'] * 1e3:.1f} "
               f"+ snapshot {fw['snapshot_s'] * 1e3:.1f} + publish {fw['publish_asks_s'] * 1e3:.1f} ms; reward: score "
               f"{fw['reward_score_s']['sync'] * 1e3:.1f} (sync) / {fw['reward_score_s']['async'] * 1e3:.1f} (async) + queue "
               f"{fw['reward_queue_s'] * 1e3:.1f} + hand-offs {fw['handoffs_s'] * 1e3:.1f} ms")
    for mode, p in pred["modes"].items():
        st = p["stages"]
        click.echo(f"  {mode:<5} (k={p['staleness']}): {p['predicted_step_s']:.3f} s/step, {p['predicted_samples_per_s']:.1f} samples/s"
                   f"  [call {st['call_s'] * 1e3:.1f} ms x {st['calls_per_step']}, train {st['train_s'] * 1e3:.1f} ms, "
                   f"{p['num_polls']} polls of {st['poll_s']:.2f} s, contention x{p['contention']['rollout']:.2f}/x{p['contention']['train']:.2f}; "
                   f"without the workflow's mechanics {p['analytical_step_s']:.3f} s]")
    if measured:
        for mode, m in measured.items():
            resp = f" (its responses: {m['measured_response_len']:.1f} tokens on average)" if "measured_response_len" in m else ""
            click.echo(f"  {mode:<5} measured {m['measured_step_s']:.3f} s/step: prediction error {m['error']:+.0%}{resp}")
