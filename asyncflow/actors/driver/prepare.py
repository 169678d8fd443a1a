"""Preparing a run directory: a new one (the data and the tiny model built when the
config names none, config.json, launch.json, the run's secret) or a resumed one (its
newest good checkpoint; metrics.jsonl, trained.jsonl and the sample logs cut back to
it, so each step appears once).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import click
import msgspec

from asyncflow.actors.driver.summary import complete_lines
from asyncflow.actors.runtime.run_dir import LaunchInfo
from asyncflow.actors.trainer.checkpoints import done_step, latest_good_checkpoint
from asyncflow.actors.trainer.manifest import MANIFEST
from asyncflow.config.load import ConfigError, dump_config
from asyncflow.config.run import RunConfig
from asyncflow.core.private_files import write_private
from asyncflow.core.transport import is_loopback


def lr_change(saved: RunConfig, cfg: RunConfig, step: int) -> str:
    """What extending a run does to its learning rate: a cosine schedule is laid over
    the run's optimizer steps (``train.num_steps x algorithm.epochs``), so more steps
    stretch it and the lr at the resume step rises. Empty when nothing changes."""
    from asyncflow.engines.lr_schedule import lr_at

    eng = cfg.train.engine
    before, after = saved.train.num_steps, cfg.train.num_steps
    if before == after or eng.lr_schedule == "constant":
        return ""
    epochs = cfg.algorithm.epochs
    was, now = lr_at(eng, step * epochs, before * epochs), lr_at(eng, step * epochs, after * epochs)
    return (
        f"!! train.num_steps {before} -> {after}: the {eng.lr_schedule} learning-rate schedule is stretched over "
        f"{after} steps, so at step {step + 1} the lr is {now:.3g} (it was {was:.3g} there) and decays from there; "
        "for a schedule of its own, start a new run from this checkpoint's weights (model.path)"
    )


def writable(rd: Path) -> None:
    """Refuse a run directory this user cannot write, before anything starts."""
    if not os.access(rd, os.W_OK | os.X_OK):
        raise ConfigError(f"run directory {rd} is not writable by this user: fix its permissions or choose another --run-dir")


def prepare_new(cfg: RunConfig, run_dir: str | os.PathLike) -> tuple[RunConfig, Path, LaunchInfo]:
    rd = Path(run_dir)
    if (rd / "metrics.jsonl").exists():
        raise ConfigError(
            f"run directory {rd} already holds a run: resume it with `afctl up --resume {rd}` or choose another --run-dir"
        )
    from asyncflow.actors.driver.preflight import check_inputs
    from asyncflow.actors.driver.topology import BUILT_IN

    check_inputs(cfg, BUILT_IN)  # imports, devices, data fields, chat template: before any process starts
    rd.mkdir(parents=True, exist_ok=True)
    writable(rd)
    data_path = cfg.data.path
    if not data_path:
        from asyncflow.toy.tasks import write_jsonl

        data_path = str(write_jsonl(rd / "data.jsonl", cfg.data.num_prompts, seed=cfg.data.seed, task=cfg.data.task))
    if cfg.eval.every_steps:  # the held-out split must leave prompts to train on: say so now, not in the loader
        from asyncflow.actors.runtime.run_dir import read_prompts, split_prompts

        try:
            split_prompts([str(r["prompt"]) for r in read_prompts(data_path)], cfg.eval.num_prompts, cfg.data.seed)
        except ValueError as exc:
            raise ConfigError(f"{exc} (data: {data_path})") from None
    model_dir = cfg.model.path
    if not model_dir:
        from asyncflow.toy.tasks import make_task_model

        click.echo(f"building the tiny {cfg.model.tiny} model into {rd / 'model'} ...")
        if cfg.data.path and cfg.model.tiny_warm_start:
            click.echo(tiny_with_own_data_warning(cfg.data.task), err=True)
        started = time.monotonic()

        def progress(done: int, total: int, loss: float) -> None:
            click.echo(f"  warm start {done}/{total} steps, loss {loss:.3f} ({time.monotonic() - started:.0f} s)")

        model_dir = str(
            make_task_model(
                rd / "model",
                seed=cfg.seed,
                arch=cfg.model.tiny,
                task=cfg.data.task,
                warm_start_steps=cfg.model.tiny_warm_start_steps if cfg.model.tiny_warm_start else 0,
                progress=progress,
            )
        )
    launch = LaunchInfo(
        model_dir=os.path.abspath(model_dir),
        base_model_dir=os.path.abspath(model_dir),
        data_path=os.path.abspath(data_path),
        reward_model_dir=reward_model_dir(cfg, rd),
    )
    cfg = with_run_secret(cfg)
    write_run_config(cfg, rd)
    (rd / "launch.json").write_bytes(msgspec.json.format(msgspec.json.encode(launch)))
    return cfg, rd, launch


def tiny_with_own_data_warning(task: str) -> str:
    """What a run with data of its own and no model should know before it trains."""
    return (
        f"!! model.path is empty: the built-in tiny model (about a million parameters, a character vocabulary) is "
        f"warm-started on the built-in task {task!r} (data.task), not on your data.path; it can learn an answer "
        "format, rarely a task of its own. To learn your task, give a real model: model.path (docs/your-model-and-data.md; "
        "examples/smollm2.toml trains SmolLM2-135M from a pip package), or set model.tiny_warm_start = false to start "
        "the tiny model from random weights"
    )


def reward_model_dir(cfg: RunConfig, rd: Path) -> str:
    """The reward-model role's model: ``reward_model.path``, or the tiny reward model of
    the task built into RUN_DIR/reward_model (a classifier without a path); empty without
    the role, or for a judge without a path (it judges with the policy's starting model)."""
    rm = cfg.reward_model
    if not rm.enabled:
        return ""
    if rm.path:
        return os.path.abspath(rm.path)
    if rm.kind == "judge":
        return ""
    from asyncflow.toy.tasks import make_task_reward_model

    click.echo(f"training the tiny reward model of the {cfg.data.task!r} task into {rd / 'reward_model'} ...")
    path = make_task_reward_model(
        rd / "reward_model", seed=cfg.seed, task=cfg.data.task, steps=rm.tiny_steps, arch=cfg.model.tiny
    )
    return os.path.abspath(path)


SECRET_FILE = "secret"
"""RUN_DIR/secret: the cluster secret of a config that sets one (mode 0600)."""


def with_run_secret(cfg: RunConfig) -> RunConfig:
    """A run on loopback tcp with neither a secret nor TLS gets a random secret of its
    own (kept in RUN_DIR/secret): without one, any local user could stop its hosts.
    Every host is started by this driver and gets it with the transport; `afctl status`
    reads it from RUN_DIR/secret. Off loopback the config must set one (or ``tls_dir``)."""
    t = cfg.cluster.transport
    if t.scheme != "tcp" or t.tls_dir or t.secret_bytes() or not is_loopback(t.bind_host):
        return cfg
    transport = msgspec.structs.replace(t, secret=secrets.token_hex(16))
    return msgspec.structs.replace(cfg, cluster=msgspec.structs.replace(cfg.cluster, transport=transport))


def write_run_config(cfg: RunConfig, rd: Path) -> None:
    """RUN_DIR/config.json, which never holds the cluster secret (it is read by every
    role and copied around); a secret set in the config goes to RUN_DIR/secret at mode 0600."""
    transport = cfg.cluster.transport
    if transport.secret:
        write_private(rd / SECRET_FILE, transport.secret.encode())
        cfg = msgspec.structs.replace(
            cfg, cluster=msgspec.structs.replace(cfg.cluster, transport=msgspec.structs.replace(transport, secret=""))
        )
    (rd / "config.json").write_text(dump_config(cfg))


def read_run_config(rd: Path) -> RunConfig:
    """RUN_DIR/config.json with the secret of RUN_DIR/secret put back (when there is one)."""
    rd = Path(rd)
    cfg = msgspec.json.decode((rd / "config.json").read_bytes(), type=RunConfig)
    secret_file = rd / SECRET_FILE
    if secret_file.exists():
        transport = msgspec.structs.replace(cfg.cluster.transport, secret=secret_file.read_text())
        cfg = msgspec.structs.replace(cfg, cluster=msgspec.structs.replace(cfg.cluster, transport=transport))
    return cfg


def prepare_resume(run_dir: str, overrides: Sequence[str] = ()) -> tuple[RunConfig, Path, LaunchInfo]:
    """Continue RUN_DIR from its newest good checkpoint; ``overrides`` (``--set``) may
    change only the keys of config/resumable.py, and are saved into config.json."""
    from asyncflow.config.resumable import apply_resume_overrides

    rd = Path(run_dir)
    if not (rd / "config.json").exists():
        raise ConfigError(f"{rd} is not a run directory (no config.json)")
    writable(rd)
    saved = read_run_config(rd)
    cfg = apply_resume_overrides(saved, overrides)
    if cfg is not saved:  # an override may ask for a step shape the run's others refuse
        from asyncflow.actors.trainer.sources import check_step_shape

        check_step_shape(cfg)
    ckpt, damaged = latest_good_checkpoint(rd)
    for path, wrong in damaged:
        click.echo(f"!! checkpoint {path.name} is damaged: {wrong}; skipping it", err=True)
    if ckpt is None:
        if damaged:
            raise ConfigError(f"{rd}: every complete checkpoint is damaged (see above); start a new run")
        raise ConfigError(f"{rd} has no complete checkpoint to resume from (checkpoints/step_*/DONE)")
    if damaged:
        click.echo(f"!! resuming from {ckpt}, the newest checkpoint that verifies", err=True)
    if not (ckpt / MANIFEST).exists():
        click.echo(f"!! checkpoint {ckpt.name} has no {MANIFEST}: resuming from it unchecked (deleted by hand?)", err=True)
    try:
        previous = msgspec.json.decode((rd / "launch.json").read_bytes(), type=LaunchInfo)
    except (OSError, msgspec.DecodeError) as exc:
        raise ConfigError(
            f"{rd / 'launch.json'} is unreadable ({type(exc).__name__}: {exc}): the run directory is damaged; "
            f"start a new run, with model.path = {str(ckpt / 'model')!r} to go on from its newest checkpoint's weights"
        ) from None
    step = done_step(ckpt)
    assert step is not None  # latest_good_checkpoint skips a checkpoint whose DONE holds no step
    if step >= cfg.train.num_steps:
        raise ConfigError(
            f"{rd} already finished its {cfg.train.num_steps} steps; to train more, raise "
            f"train.num_steps: afctl up --resume {rd} --set train.num_steps={step + max(1, step)}"
        )
    if cfg is not saved:
        write_run_config(cfg, rd)
    stretched = lr_change(saved, cfg, step)
    if stretched:
        click.echo(stretched, err=True)
    launch = LaunchInfo(
        model_dir=str(ckpt / "model"),
        base_model_dir=previous.base_model_dir,
        data_path=previous.data_path,
        start_step=step,
        resume_from=str(ckpt),
        role_states=msgspec.msgpack.decode((ckpt / "roles.msgpack").read_bytes()),
        reward_model_dir=previous.reward_model_dir,
        launch=previous.launch + 1,
    )
    (rd / "launch.json").write_bytes(msgspec.json.format(msgspec.json.encode(launch)))
    # steps after the checkpoint will be trained again: drop their records so each step appears once
    # (the sample logs of actors/trainer/_samples.py and the evaluations' records too: the steps write them again)
    for name in ("metrics.jsonl", "trained.jsonl", "samples.jsonl", "eval_samples.jsonl", "eval.jsonl"):
        path = rd / name
        if path.exists():
            kept = [line for line in complete_lines(path) if json.loads(line)["step"] < step]
            path.write_text("".join(line + "\n" for line in kept))
    return cfg, rd, launch


def resume_advice(rd: Path) -> str:
    """The resume command when the run has a complete checkpoint (the one a resume takes:
    the newest that verifies); otherwise why there is none."""
    ckpt, _ = latest_good_checkpoint(rd)
    if ckpt is not None:
        return f"Resume from its last checkpoint ({ckpt.name}): afctl up --resume {rd}"
    cfg_every = read_run_config(rd).train.checkpoint_every if (rd / "config.json").exists() else 0
    why = (
        f"train.checkpoint_every = {cfg_every}: the first is saved after step {cfg_every}"
        if cfg_every
        else "train.checkpoint_every = 0 saves one only at the end"
    )
    return f"No checkpoint to resume from: none was saved yet ({why}); fix the cause and start the run again."


def default_run_dir(config_path: str) -> str:
    return os.path.join("runs", f"{Path(config_path).stem}-{datetime.now():%Y%m%d-%H%M%S}")
