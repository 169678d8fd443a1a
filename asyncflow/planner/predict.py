"""The predicted time per step of one run config on this machine, sync and async, from a
calibrated profile (`afctl plan --config RUN.toml --profile P`).

Maps the config onto the planner: one generate call of ``prompts_per_call x
group_size`` sequences per unit (`framework.generate_call`), run to its longest
response; in async mode with a streamed rollout (``RunConfig.rollout_streams``: partial
rollout) the same sequences at mean length, since rows refill as they free and no call
waits for its tail. The async prediction is the config's rollout mode's, and
``other_rollout_mode`` what the other mode would give. The trainer's threads as
its devices, the framework's own work per unit (queue asks, the trainer's rows, the
weight snapshot), stage times from the cost model (`planner.cost`), the step from
playing out the workflow (`planner.workflow`: units, the staleness gate, the
rollout's poll, processes sharing cores). What only the config's model and data can
tell (the model's shape, the mean prompt length as the loader tokenizes it, the
seconds the configured reward functions take) comes in as `ConfigInputs`: the CLI
measures it (`asyncflow/cli/predict.py`). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

import msgspec

from asyncflow.planner import cost, framework, workflow
from asyncflow.planner.calibration import Profile
from asyncflow.planner.hardware import get_hardware
from asyncflow.planner.models import Lora, ModelShape, trainable_params

ROLLOUT_WAKES_ON_ANNOUNCE = True  # its wait ends at WeightsReady (since 51cadc0; before, a blocking get slept through it)


class ConfigInputs(msgspec.Struct, kw_only=True, frozen=True):
    """What a run config's model and data give the prediction (measured by the CLI)."""

    model: ModelShape
    prompt_tokens: float  # mean prompt length in tokens, as the loader encodes prompts
    reward_score_s: dict[str, float]  # "sync": one unit scoring a whole step; "async": one unit of rows as they come
    reward_model: ModelShape | None = None  # the [reward_model] role's model, when it runs


def predict(
    cfg,
    profile: Profile,
    inputs: ConfigInputs,
    cores: int,
    response_len: float | None = None,
    num_steps: int = 20,
    longest_response_len: float | None = None,
    *,
    poll_s: float,
    wake_on_announce: bool = ROLLOUT_WAKES_ON_ANNOUNCE,
) -> dict:
    """Predicted seconds per step of the run config `cfg` in sync and async mode, with the
    stage times, on `cores` cores from the calibrated `profile`.

    `inputs`: what the config's model and data give (`ConfigInputs`); `response_len`:
    mean response (default: the cap, or the longest if given); `longest_response_len`:
    the longest response of a generate call (default: the cap); `poll_s`: how long a
    replica held back by the staleness gate waits before it looks again (the rollout
    actor's ``ANNOUNCE_WAIT_S``, which the CLI passes: this module knows no actor)."""
    hw = get_hardware(profile.hardware)
    eff = profile.efficiency
    model, prompt, score_s = inputs.model, inputs.prompt_tokens, inputs.reward_score_s
    G = cfg.algorithm.group_size
    cap = cfg.rollout.sampling.max_new_tokens
    longest = min(cap, longest_response_len or cap)
    resp = min(response_len or longest, longest)
    batch = cfg.rollout.prompts_per_call * G
    wl = cost.Workload(
        prompt_len_tokens=max(1, round(prompt)),
        response_len_tokens=max(1, round(resp)),
        max_response_len_tokens=cap,
        prompts_per_step=cfg.train.prompts_per_step,
        samples_per_prompt=G,
        use_reference=cfg.algorithm.needs_reference,
        use_critic=cfg.algorithm.needs_critic,
        lora=Lora.of(cfg.train.engine.lora),
        weight_fanout=cfg.workflow.weight_fanout,
        weight_fanout_degree=cfg.workflow.weight_fanout_degree,
    )
    # one call: a static batch, prefilled once, decoded until its longest sample ends; finished samples leave the batch
    call = framework.generate_call(model, hw, eff, batch, prompt, resp, longest)
    # a stream (cfg.rollout_streams): a call's worth of sequences at a full batch, rows refilled as they free,
    # so no call waits for its longest: throughput-bound, mean-length decoding
    stream_call = framework.generate_call(model, hw, eff, batch, prompt, resp, resp)
    rollout_mode = "stream" if cfg.rollout_streams else "unit"
    threads = cfg.cluster.threads_per_process
    train_threads = (cfg.planner.train_threads or threads) if cfg.planner.online else threads
    # the engine trains the right-padded batch: every row as long as prompt + the longest response
    padded = msgspec.structs.replace(wl, response_len_tokens=max(1, round(longest)))
    train = cost.train_cost(model, hw, eff, padded, train_threads, 1, 1)
    ref = cost.forward_cost(model, hw, eff, padded, threads, 1) if wl.use_reference else None
    # the reward model scores beside the reference (its own processes): the later of the two holds the rows
    rm = cost.reward_model_cost(inputs.reward_model, hw, eff, padded, threads, 1) if inputs.reward_model else None
    transfer_s = cost.weight_transfer_s(model, hw, eff, 1, lora=wl.lora)  # one copy: what the trainer's publish stages
    replicas = cfg.rollout.num_replicas
    # to the last replica: every copy from the trainer (direct), or through the relay tree (workflow.weight_fanout)
    fanout_s = cost.workload_transfer_s(model, hw, eff, wl, replicas, 1)
    rollout_workers = replicas * threads
    # generate calls per step: over every loaded group (dynamic sampling over-samples; the trainer keeps at most prompts_per_step)
    C = workflow.calls_per_step(cfg.groups_per_step, cfg.rollout.prompts_per_call)
    S = wl.num_samples
    # the framework's own work per unit (afctl profile: trainer rows, weight snapshot, queue asks)
    framework_s: dict[str, Any] = {  # seconds, and score_s: seconds per mode
        "call_queue_s": framework.queue_s(eff, framework.ROLLOUT_CALL_ASKS, batch),
        "trainer_s": framework.trainer_extra_s(eff, S),
        "trainer_queue_s": framework.queue_s(eff, framework.TRAINER_STEP_ASKS, S),
        "snapshot_s": framework.snapshot_s(eff, trainable_params(model, wl.lora)),  # what a publish exports
        "publish_asks_s": framework.queue_s(eff, framework.PUBLISH_ASKS, 0),
        "reward_queue_s": framework.queue_s(eff, framework.REWARD_UNIT_ASKS, batch),
        # rollout's put -> the reward wakes; the reward's put -> the trainer wakes
        "handoffs_s": 2 * eff.queue_handoff_s,
        "reward_score_s": score_s,
    }
    out = {
        "model": model.name,
        "num_params": model.num_params,
        "prompt_tokens": prompt,
        "response_tokens": resp,
        "longest_response_tokens": longest,
        "calls_per_step": C,
        "call_batch": batch,
        "cores": cores,
        "call": {**msgspec.to_builtins(call), "time_s": call.time_s},
        "rollout_mode": rollout_mode,  # the async mode's: sync always runs calls
        "engine_train_s": train.time_s,
        "reward_model_s": rm.time_s if rm else 0.0,
        "framework": framework_s,
        "modes": {},
    }

    def play(mode: str, k: int, call: framework.CallCost) -> dict:
        """The workflow played out for one mode, its generate calls taking `call` each."""
        # processes share the cores: in sync the phases take turns (stretched only beyond the cores); in
        # async a stage shares the cores with the other side and the reward and queue processes as far as
        # they are runnable (time slices), and runs slower while the other core computes (corun_slowdown,
        # measured by afctl profile): stretches from the simulated busy fractions, iterated to a fixed point
        f_roll = workflow.contention(rollout_workers, cores) if mode == "sync" else 1.0
        f_train = workflow.contention(train_threads, cores) if mode == "sync" else 1.0
        s_roll = s_train = 1.0 if mode == "sync" else workflow.contention(rollout_workers + train_threads, cores)
        for _ in range(8 if mode == "async" else 1):
            st = workflow.StageTimes(
                call_s=call.time_s * f_roll * s_roll + framework_s["call_queue_s"],
                calls_per_step=C,
                train_s=(train.time_s + framework_s["trainer_s"]) * f_train * s_train + framework_s["trainer_queue_s"],
                publish_s=transfer_s + framework_s["snapshot_s"] * f_train * s_train + framework_s["publish_asks_s"],
                fetch_s=fanout_s + framework.queue_s(eff, framework.FETCH_ASKS, 0),
                swap_s=cost.weight_swap_s(model, hw, 1, wl.lora) + framework.queue_s(eff, framework.swap_asks(k, replicas), 0),
                reward_s=max(((r.time_s if mode == "sync" else r.latency_s) if r else 0.0) for r in (ref, rm))
                + framework_s["reward_queue_s"]
                + framework_s["handoffs_s"]
                + score_s[mode],
                poll_s=poll_s + framework.queue_s(eff, framework.POLL_ASKS, 0),
                wake_on_announce=wake_on_announce,
            )
            sim = workflow.simulate(st, replicas, k, num_steps)
            used = (s_roll, s_train)
            if mode == "async":
                # the other side, and the reward and queue processes, runnable part of the time beside a stage
                aux = [v / sim.step_s for v in framework.aux_cpu_s(eff, C, score_s["async"]).values()]
                s_roll = framework.corun_stretch(eff, sim.train_busy) * framework.shared_core_stretch(
                    [sim.train_busy] * train_threads + [sim.rollout_busy] * (rollout_workers - 1) + aux, cores
                )
                s_train = framework.corun_stretch(eff, sim.rollout_busy) * framework.shared_core_stretch(
                    [sim.rollout_busy] * rollout_workers + [sim.train_busy] * (train_threads - 1) + aux, cores
                )
        return {
            "predicted_step_s": sim.step_s,
            "predicted_samples_per_s": wl.num_samples / sim.step_s,
            "stages": msgspec.to_builtins(st),
            "contention": {"rollout": f_roll * used[0], "train": f_train * used[1]},
            "num_polls": sim.num_polls,
            "staleness": k,
            # the analytical bound without the workflow's mechanics, for comparison
            "analytical_step_s": (
                cost.sync_step(_role(C * st.call_s / replicas, replicas), _role(st.train_s, 1), None, fanout_s)
                if k == 0
                else cost.async_step(
                    _role(C * st.call_s / replicas, replicas), _role(st.train_s, 1), None, fanout_s, st.swap_s, k
                )
            ).step_s,
        }

    out["modes"]["sync"] = play("sync", 0, call)  # sync runs generate calls whatever the mode
    k = cfg.workflow.staleness
    calls = {"unit": call, "stream": stream_call}
    out["modes"]["async"] = {**play("async", k, calls[rollout_mode]), "rollout_mode": rollout_mode}
    other = "unit" if rollout_mode == "stream" else "stream"
    # what the other rollout mode would give ([workflow] partial_rollout the other way)
    out["other_rollout_mode"] = {**play("async", k, calls[other]), "rollout_mode": other}
    return out


def _role(time_s: float, devices: int):
    return cost.RoleCost(role="", devices=devices, time_s=time_s, latency_s=time_s)
