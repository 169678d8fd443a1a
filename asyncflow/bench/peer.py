"""``afctl bench peer``: TRL's GRPOTrainer, asyncflow sync and asyncflow async on the
same task, one after the other in one invocation.

TRL runs twice, on the same work: its default path (``trl``: ``model.generate`` with a
dynamic cache, as GRPOConfig ships) and its fastest path without vLLM on this device
(``trl_fast``: ``bench/_peer_trl.py``'s ``path_args``, chosen by measuring TRL's options).
asyncflow is reported against each (``sync_over_trl``, ``async_over_trl_fast``, ...) and
against the faster of the two as measured in the run (``trl_comparison`` names it;
``async_over_faster_trl``): that one is the comparison. ``--trl-path`` runs one of them.

The same model directory (the config's, or the tiny warm-started model it builds,
once), the same data file and the same prompts at every step (TRL reads the training
prompts in the order asyncflow's loader gives them: ``data.shuffle`` with
``data.order_seed``, else ``data.seed``; set ``--set data.order_seed=N`` for another
order for both), the same reward functions, prompts per step, group size,
new tokens, temperature, lr schedule, clip and grad clip, steps and seed. TRL runs in
a process of its own (``bench/_peer_trl.py``; the ``bench`` extra) with
``--trl-threads`` torch threads (default 1, as each asyncflow process has with
``cluster.threads_per_process = 1``; with 2 on a machine that other jobs share,
TRL's OpenMP threads spin waiting for a descheduled sibling and it runs ten times
slower); asyncflow runs the config as ``afctl up`` does, with no checkpoint before
the end (TRL saves none), async with the config's staleness (and its ``workflow.stream_step``:
then sync runs without it, its whole batch in one rollout call). A config with ``[eval]``
(examples/smollm2.toml) also gets each system's greedy held-out accuracy after its last
step: every system trains on the same training split, asyncflow's trainer evaluates its
last version in the run (counted in its time), and TRL's saved final weights go through
the same evaluation (``actors/evaluation/evaluator.evaluate_saved``) after its timing. ``--skip-sync`` runs
TRL and async only (more seeds of the accuracy comparison in less time; TRL's weights are
then evaluated from the async run's directory). The weights the runs leave behind (the
trainer's end-of-run checkpoint, with its optimizer state, and TRL's final model: 2 GB
for SmolLM2) are deleted once evaluated, unless ``--keep-weights``: a series of seeds
filled this machine's disk with them.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import click

from asyncflow.algorithms import registry

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "local.toml"
TRL_SYSTEMS = {"default": "trl", "fast": "trl_fast"}
"""TRL's paths (``_peer_trl.PATHS``) and the name each one's figures go under."""


def trl_spec(cfg, steps: int, threads: int, out_dir: Path, path: str = "default") -> dict:
    """What ``_peer_trl`` needs, from the run config (model and data already built);
    ``path``: TRL's generation path (``_peer_trl.PATHS``)."""
    from asyncflow.engines.precision import resolve_autocast

    eng = cfg.train.engine
    return {
        "trl_path": path,
        "model_dir": cfg.model.path,
        "data_path": cfg.data.path,
        "chat_template": cfg.data.chat_template,
        "reward_functions": list(cfg.reward.functions),
        "reward_weights": list(cfg.reward.weights),
        "samples_per_step": cfg.samples_per_step,
        "group_size": cfg.algorithm.group_size,
        "max_new_tokens": cfg.rollout.sampling.max_new_tokens,
        "temperature": cfg.rollout.sampling.temperature,
        "lr": eng.lr,
        "lr_schedule": eng.lr_schedule,
        "warmup_steps": eng.lr_warmup_steps,
        "lr_min_ratio": eng.lr_min_ratio,
        "lr_schedule_convention": eng.lr_schedule_convention,
        "clip_low": cfg.algorithm.loss.clip_low,
        "clip_high": cfg.algorithm.loss.clip_high,
        "grad_clip": eng.grad_clip,
        "bf16": resolve_autocast(eng.autocast, eng.device)
        == "bfloat16",  # mixed precision as the trainer's (TRL: accelerate's bf16 autocast)
        "device": eng.device,  # TRL trains where asyncflow's trainer does (use_cpu off on a GPU)
        "steps": steps,
        "seed": cfg.seed,
        "threads": threads,
        "out_dir": str(out_dir),
        # [eval]: TRL leaves out the held-out prompts and saves its final weights for the same evaluation
        "heldout_prompts": cfg.eval.num_prompts if cfg.eval.every_steps else 0,
        "data_seed": cfg.data.seed,
        # the training prompts in asyncflow's order (_peer_trl.in_asyncflows_order): the same prompts at every step
        "shuffle": cfg.data.shuffle,
        "order_seed": cfg.data.shuffle_seed,
    }


def unsupported(cfg) -> str | None:
    """Why TRL cannot run this config's work the same way (None: it can)."""
    alg = cfg.algorithm
    loss = alg.loss
    plain_loss = registry.loss_name(loss) == "ppo_clip" and loss.agg == "token-mean" and loss.dual_clip == 0
    if alg.name != "grpo" or alg.kl_coef > 0 or alg.epochs != 1 or not plain_loss or not alg.std_normalize:
        return (
            "bench peer compares plain GRPO: algorithm.name = 'grpo', kl_coef = 0, epochs = 1, std_normalize = true, "
            "[algorithm.loss] name = 'ppo_clip', agg = 'token-mean', dual_clip = 0"
        )
    if cfg.roles:
        return "bench peer runs no custom [[roles]]: remove them for the comparison"
    return None


@click.command()
@click.option(
    "--config", "config_path", default=str(DEFAULT_CONFIG), show_default=True, type=click.Path(exists=True, dir_okay=False)
)
@click.option("--steps", default=300, show_default=True, help="Trainer steps of each system (e.g. 3 for a smoke run).")
@click.option(
    "--trl-threads",
    default=1,
    show_default=True,
    help="Torch threads of the TRL process; 0: every core (fastest on an idle machine, very slow on a shared one).",
)
@click.option(
    "--trl-path",
    "trl_paths",
    multiple=True,
    type=click.Choice(list(TRL_SYSTEMS)),
    default=tuple(TRL_SYSTEMS),
    show_default=True,
    help="TRL's paths to run (repeatable): default (model.generate, as GRPOConfig ships) and fast (its fastest without "
    "vLLM: bench/_peer_trl.py path_args).",
)
@click.option("--skip-trl", is_flag=True, help="Run only asyncflow sync and async (no bench extra needed).")
@click.option(
    "--skip-sync",
    is_flag=True,
    help="Run TRL and asyncflow async only (more seeds of the accuracy comparison in less time).",
)
@click.option(
    "--only-trl",
    is_flag=True,
    help="Run only TRL (its samples/s at another --trl-threads, beside a run that has asyncflow's; no held-out evaluation).",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Run TRL, sync and async this many times, round after round; each figure is the median over the rounds, each "
    "ratio the median of the rounds' ratios (absolute figures move by 10-15% between runs on a shared machine).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change one config key for every system (repeatable), e.g. --set seed=1: TRL gets the same value.",
)
@click.option("--out", type=click.Path(file_okay=False), help="Keep the run directories here.")
@click.option(
    "--keep-weights",
    is_flag=True,
    help="Keep the weights the runs end with (asyncflow's checkpoints, TRL's final model); deleted once evaluated "
    "by default: 2 GB a run for SmolLM2.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def peer(
    config_path: str,
    steps: int,
    trl_threads: int,
    trl_paths: tuple[str, ...],
    skip_trl: bool,
    skip_sync: bool,
    only_trl: bool,
    rounds: int,
    overrides: tuple[str, ...],
    out: str | None,
    keep_weights: bool,
    as_json: bool,
) -> None:
    """Samples/s (training time only) and last-10% reward of TRL GRPOTrainer (its
    default path and its fastest), asyncflow sync and asyncflow async on the same work."""
    from asyncflow.bench.shared_inputs import with_shared_inputs
    from asyncflow.config.load import load_config

    if skip_trl and only_trl:
        raise click.UsageError("--skip-trl and --only-trl leave nothing to run: give one of them")
    if skip_sync and only_trl:
        raise click.UsageError("--only-trl already skips sync: give one of --skip-sync and --only-trl")
    base = load_config(config_path, overrides)
    why = unsupported(base)
    if why:
        raise click.ClickException(why)
    if not skip_trl:
        try:
            import trl  # noqa: F401
        except ImportError:
            raise click.ClickException(
                "bench peer runs TRL's GRPOTrainer: pip install -e '.[bench]' (or --skip-trl for asyncflow alone)"
            ) from None
    root = Path(out or tempfile.mkdtemp(prefix="af-peer-"))
    root.mkdir(parents=True, exist_ok=True)
    base = with_shared_inputs(base, root)
    each: list[dict[str, dict]] = []
    for r in range(rounds):
        if rounds > 1:
            click.echo(f"== round {r + 1} of {rounds} ==")
        where = root / f"round-{r}" if rounds > 1 else root
        paths = () if skip_trl else tuple(p for p in TRL_SYSTEMS if p in trl_paths)
        each.append(_one_round(base, steps, trl_threads, paths, where, only_trl, skip_sync))
        if not keep_weights:
            freed = drop_weights(where)
            if freed:
                click.echo(f"deleted the runs' final weights, {freed / 2**30:.2f} GiB (--keep-weights keeps them)")
    results = _medians(each)
    against = ratios(each, results)
    trls = [t for t in TRL_SYSTEMS.values() if t in results]
    heldout = all("heldout_accuracy" in fig for fig in results.values())
    acc_head = f"{'held-out acc':>14}" if heldout else ""
    vs_head = "".join(f"{'vs ' + t:>14}" for t in trls)
    click.echo(f"\n{'':<16}{'samples/s':>12}{'last-10% reward':>18}{acc_head}{vs_head}")
    for name, fig in results.items():
        # the median of the rounds' ratios (each round's systems ran side by side)
        vs = "".join(f"{_ratio(each, name, t):>13.2f}x" for t in trls)
        acc = f"{fig['heldout_accuracy']:>14.3f}" if heldout else ""
        click.echo(f"{name:<16}{fig['samples_per_s']:>12.1f}{fig['reward_last_10pct']:>18.3f}{acc}{vs}")
    if len(trls) > 1:
        click.echo(f"the comparison: {against['trl_comparison']}, the faster TRL path here")
    click.echo(f"(runs in {root})")
    if as_json:
        line: dict = {"steps": steps, "samples_per_step": base.samples_per_step, "rounds": rounds, "systems": results}
        # torch's huge pages for every process, TRL's too: they all inherit this environment (docs/log/real-model.md, huge pages)
        line["huge_pages"] = os.environ.get("THP_MEM_ALLOC_ENABLE") == "1"
        click.echo(json.dumps({**line, **against}))


def ratios(each: list[dict[str, dict]], results: dict[str, dict]) -> dict:
    """asyncflow against TRL: for sync and async, the median over the rounds of its
    samples/s over each TRL path's (``async_over_trl_fast``, and each round's in
    ``..._rounds``); ``trl_comparison``, the TRL path with the higher median samples/s
    (``results``: ``_medians(each)``), and each mode against it (``async_over_faster_trl``).
    Empty without TRL."""
    trls = [t for t in TRL_SYSTEMS.values() if t in results]
    if not trls:
        return {}
    faster = max(trls, key=lambda t: results[t]["samples_per_s"])
    out: dict = {"trl_comparison": faster}
    for mode in [m for m in ("sync", "async") if m in results]:
        for t in trls:
            out[f"{mode}_over_{t}"] = _ratio(each, mode, t)
            out[f"{mode}_over_{t}_rounds"] = [e[mode]["samples_per_s"] / e[t]["samples_per_s"] for e in each]
        out[f"{mode}_over_faster_trl"] = out[f"{mode}_over_{faster}"]
    return out


def _ratio(each: list[dict[str, dict]], name: str, trl: str) -> float:
    """``name``'s samples/s over TRL system ``trl``'s: the median of the rounds' ratios."""
    return statistics.median(e[name]["samples_per_s"] / e[trl]["samples_per_s"] for e in each)


def _one_round(
    base,
    steps: int,
    trl_threads: int,
    trl_paths: tuple[str, ...],
    root: Path,
    only_trl: bool = False,
    skip_sync: bool = False,
) -> dict[str, dict]:
    """TRL on each of ``trl_paths`` (none: skipped), then asyncflow sync (unless skipped),
    then async (unless ``only_trl``), one after the other, in ``root``."""
    import msgspec

    from asyncflow.actors.driver.launcher import run
    from asyncflow.actors.driver.summary import complete_lines

    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    for path in trl_paths:
        name = TRL_SYSTEMS[path]
        click.echo(f"== {name} ==")
        results[name] = _run_trl(trl_spec(base, steps, trl_threads or os.cpu_count() or 1, root / name, path), root, name)
    if only_trl:
        return results
    heldout = base.eval.every_steps > 0
    modes = ("async",) if skip_sync else ("sync", "async")
    for mode in modes:
        workflow, rollout = msgspec.structs.replace(base.workflow, mode=mode), base.rollout
        if mode == "sync" and base.workflow.stream_step:
            # the config cuts rollout calls small so that parts of a step stream to the trainer;
            # sync generates the whole batch before training: in one call, its fastest
            workflow = msgspec.structs.replace(workflow, stream_step=False)
            rollout = msgspec.structs.replace(rollout, prompts_per_call=base.train.prompts_per_step)
        cfg = msgspec.structs.replace(
            base,
            workflow=workflow,
            rollout=rollout,
            train=msgspec.structs.replace(base.train, num_steps=steps, checkpoint_every=0),
            # [eval]: one greedy evaluation, after the last step (its time counts against asyncflow's samples/s)
            eval=msgspec.structs.replace(base.eval, every_steps=steps if heldout else 0, at_start=False, save_best=False),
            logging=msgspec.structs.replace(base.logging, progress=False),
        )
        click.echo(f"== asyncflow {mode} ==")
        summary = run(cfg, root / mode)
        results[mode] = {
            "samples_per_s": summary["samples_per_s"],
            "reward_last_10pct": summary["reward_last_10pct"],
            "staleness": cfg.staleness,
            "stream_step": cfg.workflow.stream_step,
            "prompts_per_call": cfg.rollout.prompts_per_call,
            "pipeline_efficiency": summary["pipeline_efficiency"],
            # cluster.pin_trainer_cores as the run applied it (only where the machine was idle: actors/driver/_pinning.py)
            "pinned_trainer_cores": summary.get("pinned_trainer_cores", 0),
            # the mean reward of each step's samples (with TRL's, paired step by step: the same prompts)
            "reward_by_step": [json.loads(x)["reward_mean"] for x in complete_lines(root / mode / "metrics.jsonl")],
        }
        if heldout:
            results[mode]["heldout_accuracy"] = summary["val_final_accuracy"]
    if heldout:  # TRL's final weights, evaluated as asyncflow's trainer evaluates its own
        from asyncflow.actors.evaluation.evaluator import evaluate_saved

        for name in [TRL_SYSTEMS[p] for p in trl_paths]:
            # the evaluation reads the held-out prompts and the config from an asyncflow run directory
            evaluated = evaluate_saved(root / modes[0], results[name]["final_model"])
            results[name]["heldout_accuracy"] = evaluated["val/accuracy"]
    return results


def _run_trl(spec: dict, root: Path, name: str) -> dict:
    """One TRL run (``_peer_trl``, a process of its own); its output in ``root/<name>.log``."""
    spec_path = root / f"{name}_spec.json"
    spec_path.write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, "-m", "asyncflow.bench._peer_trl", str(spec_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    (root / f"{name}.log").write_text(done.stdout)
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"trl"')]
    if done.returncode != 0 or not lines:
        raise click.ClickException(
            f"TRL ({name}) failed ({done.returncode}); its output is in {root / f'{name}.log'}:\n{done.stdout[-2000:]}"
        )
    return json.loads(lines[-1])["trl"]


WEIGHTS = ("trl/final", "trl_fast/final", "sync/checkpoints", "async/checkpoints")
"""What one round leaves that only its evaluation reads, under the round's directory."""


def drop_weights(root: Path) -> int:
    """Delete the weights a round of runs in ``root`` ended with (``WEIGHTS``); the
    bytes freed. Logs, metrics, samples and the shared data stay."""
    import shutil

    freed = 0
    for rel in WEIGHTS:
        path = root / rel
        if not path.is_dir() or path.is_symlink():
            continue
        freed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(path)
    return freed


def _medians(each: list[dict[str, dict]]) -> dict[str, dict]:
    """Per system: the median samples/s over the rounds (and each round's), the last
    round's other figures (the rewards are the same every round: the runs are seeded)."""
    out = {}
    for name in each[0]:
        figures = [e[name]["samples_per_s"] for e in each]
        out[name] = {**each[-1][name], "samples_per_s": statistics.median(figures), "samples_per_s_rounds": figures}
        if "pinned_trainer_cores" in each[-1][name]:
            out[name]["pinned_trainer_cores_rounds"] = [e[name]["pinned_trainer_cores"] for e in each]
    return out
