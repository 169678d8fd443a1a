"""``afctl plan``: preview the best split of devices between rollout, training and reference.

Pure arithmetic over the cost model (asyncflow.planner); numpy and matplotlib are
imported only by `--simulate`.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from asyncflow.planner.models import PRESETS  # the shapes alone (msgspec): the help names them

GiB = 2**30


def _fmt_rate(x: float) -> str:
    return f"{x / 1e3:.1f}k" if x >= 1e4 else _sig(x)


def _sig(x: float) -> str:
    """At least one decimal, three significant digits for small numbers (seconds, rates)."""
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def _params(n: float) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _size(model) -> str:
    """ "30.5B params, 3.3B active per token" (a mixture of experts) or "7.6B params"."""
    active = f", {_params(model.num_active_params)} active per token" if model.num_experts else ""
    return f"{_params(model.num_params)} params{active}"


def _table(plans) -> list[str]:
    head = (
        "#",
        "rollout devices (instances x tp)",
        "train dev tp/pp/dp",
        "ref dev",
        "step s",
        "samples/s",
        "tokens/s",
        "bottleneck",
        "peak GiB/dev",
    )
    rows = [head]
    for i, p in enumerate(plans, 1):
        ref = f"{p.reference_devices} tp{p.reference_tp}" if p.reference_devices else "on train"
        rows.append(
            (
                str(i),
                f"{p.rollout_devices} ({p.rollout_devices // p.rollout_tp} x tp{p.rollout_tp})",
                f"{p.train_devices} {p.train_tp}/{p.train_pp}/{p.train_dp}",
                ref,
                _sig(p.predicted_step_s),
                _sig(p.predicted_samples_per_s),
                _fmt_rate(p.predicted_tokens_per_s),
                p.bottleneck,
                _sig(p.peak_memory_bytes / GiB),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
    return [
        "  ".join(cell.rjust(w) if c in (0, 4, 5, 6, 8) else cell.ljust(w) for c, (cell, w) in enumerate(zip(r, widths))).rstrip()
        for r in rows
    ]


def _boundary(infeasible) -> list:
    """Per role, the closest miss (smallest shortfall; the most devices among equals)."""
    by_role: dict[str, Any] = {}
    for item in infeasible:
        best = by_role.get(item.role)
        if best is None or (item.short_bytes, -item.devices) < (best.short_bytes, -best.devices):
            by_role[item.role] = item
    return list(by_role.values())


def _why_larger_tp(model, hw, eff, wl, best) -> str:
    """Why the best plan's rollout runs at a larger tensor-parallel degree than the smallest that
    fits in memory (a line), or "" when it does not."""
    from asyncflow.planner.search import async_rollout_score, smallest_fitting_rollout

    smallest = smallest_fitting_rollout(model, hw, eff, wl, best.rollout_devices)
    if smallest is None or smallest.tp >= best.rollout_tp:
        return ""
    from asyncflow.planner.cost import rollout_cost

    chosen = rollout_cost(model, hw, eff, wl, best.rollout_devices, best.rollout_tp)
    return (
        f"rollout at tp{best.rollout_tp} although tp{smallest.tp} fits in memory: on {best.rollout_devices} devices its "
        f"generation bounds a step at {async_rollout_score(model, hw, wl, chosen):.1f} s against "
        f"{async_rollout_score(model, hw, wl, smallest):.1f} s at tp{smallest.tp} (a larger tp holds a larger batch's KV "
        f"cache per device and shortens each decode iteration, and the long tail up to max {wl.max_response_len_tokens} "
        f"tokens is latency-bound; staleness {wl.staleness} spreads it over {wl.staleness + 1} steps)"
    )


def _default_rollout_mode(hardware: str) -> str:
    """The rollout mode an async run config gets by default on ``hardware``'s devices
    (``RunConfig.rollout_streams``, its ``workflow.partial_rollout`` default resolved)."""
    import msgspec

    from asyncflow.config.run import RunConfig

    cfg = RunConfig()
    device = "cpu" if hardware == "cpu" else "npu" if hardware == "910b" else "cuda"
    engine = msgspec.structs.replace(cfg.rollout.engine, device=device)
    cfg = msgspec.structs.replace(cfg, rollout=msgspec.structs.replace(cfg.rollout, engine=engine))
    return "stream" if cfg.rollout_streams else "unit"


def _mode_line(wl, best, other) -> str:
    """Which rollout mode the async plans assume (and the prompts_per_call that gives the best
    plan's calls), and what the other mode would give."""
    n = wl.prompts_per_call or max(1, wl.prompts_per_step // best.rollout_instances)
    groups = f"{n} prompt group{'s' if n != 1 else ''}"
    share = "" if wl.prompts_per_call else f", each replica's share: rollout.prompts_per_call = {n}"
    what = (
        f"generate calls of {groups}{share}, each running to its longest response "
        "([workflow] partial_rollout = false, or auto on a cpu)"
        if wl.rollout_mode == "unit"
        else f"one continuous stream per replica admitting {groups} at once{share} "
        "([workflow] partial_rollout = true, or auto on an accelerator)"
    )
    line = f"rollout: {wl.rollout_mode}, {what}"
    if other is not None:
        name = "a stream" if other.rollout_mode == "stream" else "unit calls"
        line += (
            f"; {name} would give {_sig(other.predicted_samples_per_s)} samples/s "
            f"({other.predicted_samples_per_s / best.predicted_samples_per_s:.2f}x) on its best split "
            f"(--rollout {other.rollout_mode})"
        )
    return line


@click.command()
@click.option(
    "--model",
    "model_name",
    default="7b",
    show_default=True,
    help=f"A preset ({', '.join(PRESETS)}; 0.5b ... 72b are Qwen2.5), or a local Hugging Face model directory or "
    "its config.json (Llama, Qwen2/3 and their mixtures of experts, Mistral/Mixtral, Gemma 2/3, OLMoE, DeepSeek). "
    "A mixture of experts computes with its active parameters and holds all of them.",
)
@click.option("--npus", type=int, help="Number of Ascend NPUs (hardware defaults to 910b).")
@click.option("--gpus", type=int, help="Number of GPUs (hardware defaults to h100).")
@click.option("--devices", type=int, help="Number of devices of --hardware (e.g. worker processes with --hardware cpu).")
@click.option("--hardware", help="910b, a100, h100, h200 or cpu.")
@click.option("--prompt-len", type=int, default=1024, show_default=True, help="Mean prompt length, tokens.")
@click.option(
    "--response-len",
    type=float,
    default=2048,
    show_default=True,
    help="Mean response length, tokens (whole tokens, except with --config).",
)
@click.option(
    "--longest-response-len",
    type=float,
    help="With --config: the longest response of a generate call, tokens (default: max_new_tokens).",
)
@click.option("--max-response-len", type=int, default=8192, show_default=True, help="Generation cap, tokens (the long tail).")
@click.option("--batch-size", type=int, default=256, show_default=True, help="Prompts per RL step.")
@click.option("-n", "--samples-per-prompt", type=int, default=8, show_default=True, help="Responses per prompt (GRPO group).")
@click.option(
    "--staleness", type=int, default=1, show_default=True, help="k: a sample of policy v trains at step s only if s - v <= k."
)
@click.option("--no-reference", is_flag=True, help="No KL to a reference policy (no reference forward).")
@click.option("--critic", is_flag=True, help="PPO: add a critic (forward and training on the training devices).")
@click.option(
    "--reward-model",
    "reward_model_name",
    help="A reward model served as its own role ([reward_model]): a preset or a local HF directory, like --model.",
)
@click.option(
    "--reward-model-devices",
    type=int,
    default=1,
    show_default=True,
    help="Devices of the reward-model role (with --reward-model).",
)
@click.option(
    "--lora-rank",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="LoRA adapter rank ([train.engine.lora] rank); 0: full fine-tuning. Only the adapters get gradients, "
    "optimizer state and a weight sync.",
)
@click.option(
    "--lora-targets",
    default="q_proj,k_proj,v_proj,o_proj",
    show_default=True,
    help="With --lora-rank: the adapted linear layers of each block, comma-separated.",
)
@click.option("--lora-train-norms", is_flag=True, help="With --lora-rank: the RMSNorm weights train (and sync) too.")
@click.option(
    "--weight-fanout",
    type=click.Choice(["direct", "tree"]),
    default="direct",
    show_default=True,
    help="[workflow] weight_fanout: the trainer sends every rollout instance its copy (direct), or the instances "
    "relay it in a tree (the trainer sends --weight-fanout-degree copies).",
)
@click.option(
    "--weight-fanout-degree", type=click.IntRange(1, 64), default=2, show_default=True, help="Children per node of the tree."
)
@click.option(
    "--rollout",
    "rollout_mode",
    type=click.Choice(["unit", "stream"]),
    help="How an async replica generates: unit, generate calls of --prompts-per-call groups that each run to their "
    "longest response ([workflow] partial_rollout = false); stream, one continuous batch that new groups join as rows "
    "free ([workflow] partial_rollout = true). Default: what a run config's partial_rollout = auto picks on "
    "--hardware (a stream on an accelerator, unit calls on a cpu). The other mode's "
    "prediction is printed too.",
)
@click.option(
    "--prompts-per-call",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="[rollout] prompts_per_call: prompt groups per generate call (a stream admits this many groups' sequences "
    "at once); 0: each replica's share of the step, the most a replica can use (set prompts_per_call to the plan's "
    "prompts over its rollout instances).",
)
@click.option("--top", type=int, default=5, show_default=True, help="Plans to show.")
@click.option(
    "--profile", "profile_path", type=click.Path(dir_okay=False), help="Calibrated efficiency factors from `afctl profile`."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (key `plans`, best first) as the last line.")
@click.option(
    "--simulate", "simulate_dir", type=click.Path(file_okay=False), help="Write a trace and timeline PNG of the best plan here."
)
@click.option("--steps", type=int, default=6, show_default=True, help="Steps to simulate with --simulate.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Predict this run config's time per step on this machine, sync and async (needs --profile).",
)
@click.option(
    "--compare",
    "compare_dir",
    type=click.Path(exists=True, file_okay=False),
    help="With --config: the --out directory of `afctl bench e2e`, to print the prediction errors.",
)
def plan(
    model_name,
    npus,
    gpus,
    devices,
    hardware,
    prompt_len,
    response_len,
    longest_response_len,
    max_response_len,
    batch_size,
    samples_per_prompt,
    staleness,
    no_reference,
    critic,
    reward_model_name,
    reward_model_devices,
    lora_rank,
    lora_targets,
    lora_train_norms,
    weight_fanout,
    weight_fanout_degree,
    rollout_mode,
    prompts_per_call,
    top,
    profile_path,
    as_json,
    simulate_dir,
    steps,
    config_path,
    compare_dir,
) -> None:
    """Preview the best split of devices between rollout, training and reference.

    Example: afctl plan --model 32b --npus 512; afctl plan --model 7b --gpus 64 --hardware h100;
    afctl plan --config examples/local.toml --profile cpu.toml (this machine, one config)
    """
    if config_path:
        from asyncflow.cli.predict import run_predict

        len_given = click.get_current_context().get_parameter_source("response_len") == click.core.ParameterSource.COMMANDLINE
        run_predict(
            config_path,
            profile_path,
            response_len if len_given else None,
            steps if click.get_current_context().get_parameter_source("steps") == click.core.ParameterSource.COMMANDLINE else 20,
            compare_dir,
            as_json,
            longest_response_len=longest_response_len,
        )
        return
    response_len = int(round(response_len))
    import msgspec

    from asyncflow.planner.calibration import Efficiency
    from asyncflow.planner.cost import Workload
    from asyncflow.planner.hardware import get_hardware
    from asyncflow.planner.io import get_model, load_profile
    from asyncflow.planner.models import Lora, linear_features, total_params, trainable_params
    from asyncflow.planner.search import best_sync, search, speedup

    try:  # the model first: a wrong name is the mistake to report, whatever else is missing
        model = get_model(model_name)
    except (ValueError, FileNotFoundError) as exc:
        raise click.BadParameter(str(exc), param_hint="--model") from None
    try:
        reward_model = get_model(reward_model_name) if reward_model_name else None
    except (ValueError, FileNotFoundError) as exc:
        raise click.BadParameter(str(exc), param_hint="--reward-model") from None
    if reward_model is not None and reward_model_devices < 1:
        raise click.BadParameter("the reward model needs at least one device", param_hint="--reward-model-devices")
    targets = tuple(m.strip() for m in lora_targets.split(",") if m.strip())
    lora = Lora(rank=lora_rank, target_modules=targets, train_norms=lora_train_norms)
    try:
        for m in lora.target_modules if lora.rank else ():
            linear_features(model, m)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--lora-targets") from None
    given = [x for x in (npus, gpus, devices) if x is not None]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --npus N, --gpus N or --devices N")
    num_devices = given[0]
    hw_name = hardware or ("910b" if npus is not None else "h100" if gpus is not None else "cpu")
    try:
        hw = get_hardware(hw_name)
        eff = Efficiency()
        if profile_path:
            prof = load_profile(profile_path)
            eff = prof.efficiency
            if prof.hardware != hw.name:
                click.echo(f"warning: profile {profile_path} was measured on {prof.hardware}, planning for {hw.name}", err=True)
        wl = Workload(
            prompt_len_tokens=prompt_len,
            response_len_tokens=response_len,
            max_response_len_tokens=max_response_len,
            prompts_per_step=batch_size,
            samples_per_prompt=samples_per_prompt,
            staleness=staleness,
            use_reference=not no_reference,
            use_critic=critic,
            lora=lora,
            weight_fanout=weight_fanout,
            weight_fanout_degree=weight_fanout_degree,
            rollout_mode=rollout_mode or _default_rollout_mode(hw.name),
            prompts_per_call=prompts_per_call,
        )
        result = search(
            model, hw, wl, num_devices, eff, top_k=top, reward_model=reward_model, reward_model_devices=reward_model_devices
        )
        other_mode = "unit" if wl.rollout_mode == "stream" else "stream"
        other_result = search(
            model,
            hw,
            msgspec.structs.replace(wl, rollout_mode=other_mode),
            num_devices,
            eff,
            top_k=1,
            reward_model=reward_model,
            reward_model_devices=reward_model_devices,
        )
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    other_best = other_result.plans[0] if other_result.plans else None

    sync = best_sync(result)
    gain = speedup(result)
    if simulate_dir and result.plans:
        from asyncflow.planner.io import simulate_plan

        sim = simulate_plan(model, hw, eff, wl, result.plans[0], num_steps=steps, out_dir=simulate_dir)
    else:
        sim = None

    if as_json:
        out = {
            "model": model.name,
            "hardware": hw.name,
            "num_devices": num_devices,
            "workload": wl,
            "plans": result.plans,
            "sync": result.sync,
            "colocated": result.colocated,
            "predicted_async_speedup": gain,
            "rollout_mode": wl.rollout_mode,
            "other_rollout_mode": (
                {
                    "rollout_mode": other_mode,
                    "predicted_step_s": other_best.predicted_step_s,
                    "predicted_samples_per_s": other_best.predicted_samples_per_s,
                    "predicted_async_speedup": speedup(other_result),
                }
                if other_best is not None
                else None
            ),
            "infeasible": result.infeasible,
            "num_splits": result.num_splits,
            "num_infeasible_splits": result.num_infeasible_splits,
            "simulation": sim,
        }
        sys.stdout.write(msgspec.json.encode(out).decode() + "\n")
        return

    click.echo(
        f"{model.name} ({_size(model)}) on {num_devices} x {hw.name}: "
        f"{wl.prompts_per_step} prompts x {wl.samples_per_prompt} samples, prompt {wl.prompt_len_tokens}, "
        f"response {wl.response_len_tokens} (max {wl.max_response_len_tokens}), staleness {wl.staleness}"
        + (f", profile {profile_path}" if profile_path else ", default efficiencies (calibrate: afctl profile)")
    )
    if lora.rank:
        click.echo(
            f"LoRA rank {lora.rank} on {', '.join(lora.target_modules)}{' + norms' if lora.train_norms else ''}: "
            f"{_params(trainable_params(model, lora))} trainable of {_params(total_params(model, lora))} params "
            "(grads, optimizer state and weight sync for the trainable ones only)"
        )
    if not result.plans:
        misses = _boundary(result.infeasible)
        if misses:
            click.echo("no plan fits in memory:")
        else:  # every role fits somewhere: the prompt groups' shares ruled every split out
            click.echo(f"no split gives the training ranks equal shares of the {wl.prompts_per_step} prompt groups")
        for item in misses:
            click.echo(f"  {item.reason}")
        node_share = model.num_params * 2 / hw.devices_per_node  # bf16 weights over one node's devices
        if node_share > hw.memory_bytes * hw.usable_memory_fraction:
            raise click.ClickException(
                f"{model.name}'s weights are {_sig(node_share / GiB)} GiB per device even at tp {hw.devices_per_node} "
                f"over a whole node of {hw.name} ({_sig(hw.memory_bytes * hw.usable_memory_fraction / GiB)} GiB usable): "
                "a rollout instance is one node at most here (no pipeline or expert parallelism), so no device count "
                "fits; use devices with more memory (--hardware) or a smaller model"
            )
        raise click.ClickException("use more devices, a smaller model, or a shorter --max-response-len")
    for line in _table(result.plans):
        click.echo(line)
    click.echo(_mode_line(wl, result.plans[0], other_best))
    why_tp = _why_larger_tp(model, hw, eff, wl, result.plans[0])
    if why_tp:
        click.echo(why_tp)
    if reward_model is not None:
        best = result.plans[0]
        click.echo(
            f"reward model {reward_model.name} ({_size(reward_model)}): its own {best.reward_model_devices} "
            f"device(s) at tp{best.reward_model_tp}, {_sig(best.stage_s['reward_model'])} s of scoring per step, "
            f"{_sig(best.memory_bytes['reward_model'] / GiB)} GiB/dev"
        )
    if any(p.bottleneck == "dependency" for p in result.plans):
        click.echo(
            "(dependency: the generate -> train -> weight-sync loop spread over staleness+1 steps; "
            "a larger --staleness relaxes it)"
        )
    if sync is not None:
        alt = result.colocated if sync is result.colocated else result.sync
        assert alt is not None  # sync is one of the two
        where = (
            "colocated on all devices (verl-like)"
            if alt.mode == "colocated"
            else f"task-separated, rollout {alt.rollout_devices} / train {alt.train_devices}"
        )
        other = result.sync if alt is result.colocated else result.colocated
        other_txt = f"; the other sync option ({other.mode}) {_sig(other.predicted_step_s)} s" if other is not None else ""
        click.echo(
            f"sync alternative: {where}, {_sig(alt.predicted_step_s)} s/step, {_sig(alt.predicted_samples_per_s)} samples/s, "
            f"bottleneck {alt.bottleneck}{other_txt}. Predicted speedup of the "
            f"{'asynchronous' if wl.staleness else 'streaming (staleness 0)'} plan: {gain:.2f}x"
        )
    else:
        click.echo("sync alternative: none fits in memory")
    if result.num_infeasible_splits:
        misses = _boundary(result.infeasible)
        if misses:
            click.echo(
                f"{result.num_infeasible_splits} of {result.num_splits} splits do not fit, or would give the training ranks "
                f"unequal shares of the {wl.prompts_per_step} prompt groups; each role's closest miss in memory:"
            )
        else:  # every role fits somewhere: only the prompt groups' shares ruled splits out
            click.echo(
                f"{result.num_infeasible_splits} of {result.num_splits} splits would give the training ranks unequal "
                f"shares of the {wl.prompts_per_step} prompt groups (every role fits in memory)"
            )
        for item in misses:
            click.echo(f"  {item.reason}")
    if sim is not None:
        click.echo(
            f"simulated {sim.num_steps} steps: sync {_sig(sim.sync_step_s)} s/step, async {_sig(sim.async_step_s)} s/step "
            f"({sim.sync_step_s / sim.async_step_s:.2f}x); wrote {sim.trace_path} and {sim.png_path}"
        )
