"""``afctl twin``: a digital twin of a cluster on this machine. The planner's split of
``npus`` devices of ``hardware`` for ``model`` becomes an emulated-engine run config
(rollout replicas of ``rollout_tp`` devices, packed many to a process with
``cluster.actors_per_process``; an emulated trainer on the plan's training devices),
which runs with the real control plane (driver, directory, queue, loader, weight sync)
in sync, async and a colocated sequential baseline, one after the other. It prints, per
mode, the framework's overhead per step (queue, weights, directory, driver), the
throughput reached against the planner's prediction, and the speedups.

Pure parts (``plan_modes``, ``config_text``, ``figures``) are separate from the runs
(``run_mode``) so the tests check them without a cluster.

Time: every modelled second is ``time_scale`` seconds here (the emulated engines sleep
the cost model's device time times it). Throughput is reported in modelled samples/s
(measured samples/s x time_scale), the unit of the planner's prediction. The
overheads are what this machine's processes spend per step, in wall ms here: their
fraction of the emulated step is of the step as run (at this time_scale).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from asyncflow.config.load import load_config_text
from asyncflow.config.run import RunConfig
from asyncflow.planner.calibration import Efficiency
from asyncflow.planner.cost import Workload, weight_transfer_s
from asyncflow.planner.hardware import get_hardware
from asyncflow.planner.models import PRESETS
from asyncflow.planner.search import Plan, search

MODES = ("sync", "async", "colocated")
ROLLOUTS = ("auto", "unit", "stream")
DEFAULT_ROLLOUT = "auto"
"""``--rollout``: how async replicas generate. unit: one generate call per unit of
``prompts_per_call`` groups (``workflow.partial_rollout = false``); stream: one continuous
stream per replica (partial rollout, ``workflow.partial_rollout = true``); auto: what the
run config's ``workflow.partial_rollout = "auto"`` takes for the twin's run
(``RunConfig.rollout_mode_why``). Sync and colocated always run unit."""
MODELS = ("7b", "32b")
HARDWARE = ("910b", "h100", "a100", "h200")
MAX_NEW_TOKENS = 64
"""Emulated tokens of the longest response: with ``TOKEN_SCALE`` it stands for 8,192."""
TOKEN_SCALE = 128
RESPONSE_MEDIAN_FRACTION = 0.16
"""The emulated lengths' median as a fraction of MAX_NEW_TOKENS: a mean near 16 tokens (2,048 modelled)."""
RESPONSE_SIGMA = 1.0
MAX_PROCESSES = 4
"""Rollout processes at most: replicas are packed ceil(replicas / 4) to a process."""
WARMUP_STEPS = 2
"""Steps left out of the steady-state figures (the pipeline filling, the first weights)."""


class TwinError(ValueError):
    """A flag's value the twin cannot run, with the flag's name and the fix."""


class ModePlan(msgspec.Struct, kw_only=True):
    mode: str  # "sync", "async" or "colocated"
    rollout: str = "unit"  # "unit" or "stream" (async only: partial rollout); "auto" until plan_modes resolves it
    workflow_mode: str  # the run config's workflow.mode ("colocated" runs in sync)
    replicas: int
    rollout_tp: int
    rollout_devices: int
    train_devices: int
    train_tp: int
    train_pp: int
    prompts_per_call: int
    per_process: int
    predicted_step_s: float  # modelled seconds
    predicted_samples_per_s: float  # modelled
    predicted_stage_s: dict[str, float]
    bottleneck: str
    predicted_weight_s: float = math.nan  # modelled: the planner's transfer of a version to every replica
    rollout_mode: str = ""  # the planner's model of the rollout: "unit", "stream", or "step" (sync, colocated)


def emulated_mean_response(seed: int = 0, draws: int = 20000) -> float:
    """Mean emulated response length (tokens) of the twin's length distribution: the
    emulated rollout's draw (``engines/emulated_model.response_length``, which this side
    of the engine boundary may not import; tests/bench/test_twin.py checks they agree)."""
    r = random.Random(seed)
    median = max(1.0, RESPONSE_MEDIAN_FRACTION * MAX_NEW_TOKENS)
    total = 0
    for _ in range(draws):
        total += max(1, min(MAX_NEW_TOKENS, math.ceil(median * math.exp(RESPONSE_SIGMA * r.gauss(0.0, 1.0)))))
    return total / draws


def workload(prompts: int, group: int, prompt_tokens: float, response_tokens: float) -> Workload:
    """The planner's workload of the twin: its batch and group, and its emulated lengths in
    modelled tokens (x TOKEN_SCALE, of spread RESPONSE_SIGMA: a unit call's longest). No reference
    (the emulated run has none) and staleness 1. Its calls are a replica's share of the step
    (``prompts_per_call`` 0, as ``_mode_plan`` configures); ``plan_modes`` sets the rollout mode."""
    return Workload(
        response_len_sigma=RESPONSE_SIGMA,
        prompt_len_tokens=max(1, round(prompt_tokens * TOKEN_SCALE)),
        response_len_tokens=max(1, round(response_tokens * TOKEN_SCALE)),
        max_response_len_tokens=MAX_NEW_TOKENS * TOKEN_SCALE,
        prompts_per_step=prompts,
        samples_per_prompt=group,
        staleness=1,
        use_reference=False,
    )


def check_flags(
    model: str,
    npus: int,
    hardware: str,
    steps: int,
    time_scale: str,
    modes: str,
    prompts: int,
    group: int,
    rollout: str = DEFAULT_ROLLOUT,
) -> list[str]:
    """The modes asked for; a ``TwinError`` naming the flag and the fix for a value the twin cannot run."""
    if model not in MODELS:
        raise TwinError(f"--model {model!r}: the twin emulates the planner's presets {', '.join(MODELS)}; use --model 7b or 32b")
    if hardware not in HARDWARE:
        raise TwinError(f"--hardware {hardware!r}: use one of {', '.join(HARDWARE)}")
    if npus < 2:
        raise TwinError(f"--npus {npus}: a task-separated plan needs at least 2 devices (one for rollout, one for training)")
    if steps < WARMUP_STEPS + 2:
        raise TwinError(
            f"--steps {steps}: the first {WARMUP_STEPS} steps fill the pipeline and are left out; use --steps {WARMUP_STEPS + 2} or more"
        )
    if time_scale != "auto":
        try:
            scale = float(time_scale)
        except ValueError:
            scale = math.nan
        if not scale > 0 or math.isinf(scale):
            raise TwinError(f"--time-scale {time_scale!r}: give a positive number (1e-2: a 100 s step sleeps 1 s) or 'auto'")
    asked = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in asked if m not in MODES]
    if bad or not asked:
        raise TwinError(
            f"--modes {modes!r}: {'unknown ' + ', '.join(bad) if bad else 'none given'}; use a comma list of {','.join(MODES)}"
        )
    if prompts < 1 or group < 1:
        raise TwinError(f"--prompts {prompts} --group {group}: both must be 1 or more")
    if rollout not in ROLLOUTS:
        raise TwinError(f"--rollout {rollout!r}: use auto, unit or stream (how async replicas generate)")
    return list(dict.fromkeys(asked))


def _mode_plan(mode: str, plan: Plan, prompts: int, rollout: str = DEFAULT_ROLLOUT) -> ModePlan:
    replicas = plan.rollout_instances
    return ModePlan(
        mode=mode,
        rollout=rollout if mode == "async" else "unit",
        workflow_mode="async" if mode == "async" else "sync",
        replicas=replicas,
        rollout_tp=plan.rollout_tp,
        rollout_devices=plan.rollout_devices,
        train_devices=plan.train_devices,
        train_tp=plan.train_tp,
        train_pp=plan.train_pp,
        # one call per replica per step where the batch allows: a call is the instance's share of the step
        prompts_per_call=max(1, prompts // replicas),
        per_process=max(1, math.ceil(replicas / MAX_PROCESSES)),
        predicted_step_s=plan.predicted_step_s,
        predicted_samples_per_s=plan.predicted_samples_per_s,
        predicted_stage_s=dict(plan.stage_s),
        bottleneck=plan.bottleneck,
        rollout_mode=plan.rollout_mode,
    )


def plan_modes(
    model: str, hardware: str, npus: int, wl: Workload, modes: list[str], rollout: str = DEFAULT_ROLLOUT
) -> dict[str, ModePlan]:
    """Each mode's split, as the planner makes it: async its best plan, sync its best
    task-separated sync plan, colocated every role on all ``npus`` in turn. Async runs
    ``rollout`` (unit or stream; auto: what the run config's ``partial_rollout = "auto"``
    takes for it), the others unit."""
    hw = get_hardware(hardware)
    result = search(PRESETS[model], hw, wl, npus)
    found = {"async": result.plans[0] if result.plans else None, "sync": result.sync, "colocated": result.colocated}
    out = {}
    for mode in modes:
        plan = found[mode]
        if plan is None:
            short = "; ".join(i.reason for i in result.infeasible[:2]) or "no split fits"
            raise TwinError(f"--npus {npus}: no {mode} plan of {model} on {hardware} fits ({short}); raise --npus")
        out[mode] = mp = _mode_plan(mode, plan, wl.prompts_per_step, rollout)
        mp.predicted_weight_s = planner_weight_s(mp, model, hardware)
        if mp.rollout == "auto":  # the run config's one decision point says which the run takes
            text = config_text(mp, model, hardware, 1.0, WARMUP_STEPS + 2, wl.prompts_per_step, wl.samples_per_prompt)
            mp.rollout = "stream" if load_config_text(text, "twin").rollout_streams else "unit"
        if mode == "async" and mp.rollout != plan.rollout_mode:
            # the planner models the rollout the run takes (unit calls each pay their tail): its best split for it
            runs = search(PRESETS[model], hw, msgspec.structs.replace(wl, rollout_mode=mp.rollout), npus).plans
            if not runs:
                raise TwinError(
                    f"--npus {npus}: no async plan of {model} on {hardware} fits a {mp.rollout} rollout; raise --npus"
                )
            out[mode] = mp = _mode_plan(mode, runs[0], wl.prompts_per_step, mp.rollout)
            mp.predicted_weight_s = planner_weight_s(mp, model, hardware)
    return out


_PARTIAL = {"auto": '"auto"', "unit": "false", "stream": "true"}  # workflow.partial_rollout of each --rollout

EMULATED_WEIGHT_BYTES = 64 * 4
"""What one emulated version sends: the emulated engines' one 64-float tensor (``engines/emulated_model.py``,
``WEIGHT_ELEMENTS``, which this side of the engine boundary may not import; tests/bench/test_twin.py checks they agree)."""


def planner_weight_s(mp: ModePlan, model: str, hardware: str) -> float:
    """The planner's weight transfer of a mode's split, modelled seconds (``weight_transfer_s``: direct, each
    replica's shard of the real model's bf16 parameters over the inter-node link; colocated, one local reshard)."""
    hw = get_hardware(hardware)
    colocated = mp.mode == "colocated"
    return weight_transfer_s(PRESETS[model], hw, Efficiency(), mp.rollout_tp, colocated=colocated, replicas=mp.replicas)


def weight_link_mb_s(mp: ModePlan, model: str, hardware: str, time_scale: float) -> float:
    """``workflow.weight_link_mb_s`` for a mode: the rate at which the emulated version's copies, one per replica
    over the trainer's emulated link, take the planner's weight transfer for that split (``planner_weight_s``)
    times ``time_scale``. Every emulated copy of 256 bytes so stands for a replica's real bytes at the hardware's
    link rate (direct fan-out, the twin's; the tree's chunk pipeline would need the real chunk count)."""
    hw = get_hardware(hardware)
    link_s = (
        max(1e-9, planner_weight_s(mp, model, hardware) - hw.collective_latency_s) * time_scale
    )  # the latency is not a link's
    return mp.replicas * EMULATED_WEIGHT_BYTES / link_s / 1e6


def weight_time_s(trace: dict) -> list[float]:
    """Seconds from each version's publish (the trainer's ``sync_weights`` span's start) to the last replica
    holding it (the end of the replicas' fetch spans, ``rollout/inbox.FETCH_SPAN``, begun before the next
    publish), in order; a version no replica fetched is left out. The weight time the planner's transfer is."""
    from asyncflow.actors.rollout.inbox import FETCH_SPAN

    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    publishes = sorted(e["ts"] / 1e6 for e in events if e["name"] == "sync_weights")
    fetches = sorted((e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in events if e["name"] == FETCH_SPAN)
    out = []
    for i, t in enumerate(publishes):
        until = publishes[i + 1] if i + 1 < len(publishes) else math.inf
        ends = [end for start, end in fetches if t <= start < until]
        if ends:
            out.append(max(ends) - t)
    return out


def config_text(
    mp: ModePlan,
    model: str,
    hardware: str,
    time_scale: float,
    steps: int,
    prompts: int,
    group: int,
    model_path: str = "",
    data_path: str = "",
) -> str:
    """The run config (TOML) of one mode of the twin (``afctl up`` runs it as it is);
    ``model_path``, ``data_path``: the tokenizer and prompts built once for every mode."""
    model_line = f"path = {json.dumps(model_path)}\n" if model_path else ""
    data_line = f"path = {json.dumps(data_path)}\n" if data_path else ""
    emulated = f'model = "{model}"\nhardware = "{hardware}"\ntime_scale = {time_scale!r}\ntoken_scale = {TOKEN_SCALE}\n'
    head = f"{mp.mode}, rollout {mp.rollout} ({mp.replicas} rollout replicas of {mp.rollout_tp} devices, trainer on {mp.train_devices})"
    return f"""# afctl twin: {head}
seed = 0

[model]
tiny = "qwen2"
tiny_warm_start = false
{model_line}
[data]
{data_line}num_prompts = {max(1000, prompts * (steps + 2))}

[algorithm]
group_size = {group}

[rollout]
num_replicas = {mp.replicas}
prompts_per_call = {mp.prompts_per_call}
[rollout.sampling]
max_new_tokens = {MAX_NEW_TOKENS}
[rollout.engine]
type = "emulated"
[rollout.engine.emulated]
{emulated}rollout_tp = {mp.rollout_tp}
response_median_fraction = {RESPONSE_MEDIAN_FRACTION}
response_sigma = {RESPONSE_SIGMA}

[reward]
placement = "rollout"
functions = ["asyncflow.toy.tasks:reward"]

[train]
num_steps = {steps}
prompts_per_step = {prompts}
checkpoint_every = 0
[train.engine]
type = "emulated"
[train.engine.emulated]
{emulated}train_devices = {mp.train_devices}
train_tp = {mp.train_tp}
train_pp = {mp.train_pp}

[workflow]
mode = "{mp.workflow_mode}"
staleness = {1 if mp.workflow_mode == "async" else 0}
partial_rollout = {_PARTIAL[mp.rollout]}
verify_weights = "error"
weight_link_mb_s = {weight_link_mb_s(mp, model, hardware, time_scale)!r}  # the real model's transfer, times time_scale

[cluster]
actors_per_process = {mp.per_process}

[logging]
progress = false
"""


# ---------------------------------------------------------------- measuring a run


def _cpu_s(path: str) -> float:
    """CPU seconds one thread ran, from its /proc ``schedstat`` (nanoseconds; 0 once it is
    gone). ``path``: /proc/PID/task/TID."""
    try:
        with open(f"{path}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _open_fds() -> float:
    """File descriptors this (the driver's) process holds: sockets to every actor it talks to."""
    try:
        return float(len(os.listdir("/proc/self/fd")))
    except OSError:
        return math.nan


class CpuSampler:
    """The CPU seconds of the run's control-plane parts, read at each trainer step's
    metrics line: the queue (its host and the shards' processes, pids from
    RUN_DIR/cluster.json), the directory (its listener and actor threads in this, the
    driver's, process) and the rest of the driver process (supervisor, collector,
    roster, loggers). Every thread is counted at the last value seen, so one that
    ended keeps its share. ``on_step`` is called with each new step's count."""

    def __init__(self, run_dir: Path, on_step: Callable[[int], None]):
        self.run_dir = run_dir
        self.on_step = on_step
        self.marks: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._queue_pids: list[int] = []
        self._threads: dict[tuple[int, int], tuple[str, float]] = {}  # (pid, tid) -> (part, cpu seconds)
        self._thread = threading.Thread(target=self._loop, name="twin-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stops the sampling; a step written since the last poll is marked now."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._poll()

    def _see(self, pid: int, tid: int, part: str) -> None:
        cpu = _cpu_s(f"/proc/{pid}/task/{tid}")
        if cpu or (pid, tid) not in self._threads:
            self._threads[(pid, tid)] = (part, cpu)

    def _sample(self) -> None:
        if not self._queue_pids:
            try:
                hosts = json.loads((self.run_dir / "cluster.json").read_text())["hosts"]
            except (OSError, ValueError, KeyError):
                hosts = {}
            self._queue_pids = [p for n, p in hosts.items() if n == "queue" or n.startswith("shard.")]
        for pid in self._queue_pids:
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tids:
                self._see(pid, tid, "queue")
        me, here = threading.get_native_id(), os.getpid()
        names = {t.native_id: t.name for t in threading.enumerate()}
        for tid in (int(t) for t in os.listdir("/proc/self/task")):
            if tid == me:
                continue
            name = names.get(tid, "")
            self._see(here, tid, "directory" if name == "listen-directory" or name.startswith("DirectoryActor-") else "driver")

    def mark(self) -> dict[str, float]:
        self._sample()
        out = {"time": time.monotonic(), "queue": 0.0, "directory": 0.0, "driver": 0.0, "driver_fds": _open_fds()}
        for part, cpu in self._threads.values():
            out[part] += cpu
        return out

    def _poll(self) -> None:
        try:
            self._poll_once()
        except OSError:  # out of descriptors, a process gone: the next poll tries again
            pass

    def _poll_once(self) -> None:
        try:
            with open(self.run_dir / "metrics.jsonl") as f:
                lines = sum(1 for line in f if line.strip())
        except OSError:
            self._sample()  # the threads that end before the first step still count
            return
        if lines > len(self.marks):
            seen = len(self.marks)
            self.marks.extend([self.mark()] * (lines - seen))
            self.on_step(lines)

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            self._poll()


def _trace_ms_per_step(trace_path: Path, steps: int) -> dict[str, float]:
    """The trainer's weight publishing (``sync_weights``), ms per step, from trace.json."""
    from asyncflow.bench._breakdown import breakdown
    from asyncflow.cli.runs import load_trace

    try:
        b = breakdown(load_trace(trace_path), steps)
    except (OSError, ValueError, KeyError):
        return {"weights_ms": math.nan}
    trainer = b.get("trainer", {})
    return {"weights_ms": trainer.get("activities", {}).get("sync_weights", 0.0)}


def figures(
    metrics: list[dict],
    marks: list[dict[str, float]],
    time_scale: float,
    weights_ms: float,
    mp: ModePlan,
    weight_s: list[float] | None = None,
) -> dict:
    """A mode's figures from its metrics lines and CPU marks, the first WARMUP_STEPS left out; ``weight_s``:
    each version's weight time (``weight_time_s``), its first WARMUP_STEPS left out too."""
    w = min(WARMUP_STEPS, len(metrics) - 2)
    span = metrics[-1]["time_s"] - metrics[w]["time_s"]
    steps = len(metrics) - 1 - w
    samples = sum(m["samples"] for m in metrics[w + 1 :])
    step_s = span / max(steps, 1)
    measured = samples / max(span, 1e-9) * time_scale  # modelled samples/s
    emulated_ms = mp.predicted_step_s * time_scale * 1e3
    overhead = {}
    if len(marks) == len(metrics):
        a, b = marks[w], marks[-1]
        for part in ("queue", "directory", "driver"):
            overhead[part] = 1e3 * (b[part] - a[part]) / max(steps, 1)
    else:
        overhead = {part: math.nan for part in ("queue", "directory", "driver")}
    overhead["weights"] = weights_ms
    fds = [m.get("driver_fds", math.nan) for m in marks]
    kept = (weight_s or [])[WARMUP_STEPS:]
    return {
        "rollout": mp.rollout,
        "weight_ms": 1e3 * sum(kept) / len(kept) if kept else math.nan,
        "predicted_weight_ms": 1e3 * time_scale * mp.predicted_weight_s,
        "driver_fds_max": max(fds) if fds else math.nan,
        "mode": mp.mode,
        "replicas": mp.replicas,
        "rollout_tp": mp.rollout_tp,
        "train_devices": mp.train_devices,
        "processes_per_rollout": mp.per_process,
        "steps_measured": steps,
        "emulated_step_ms": emulated_ms,
        "measured_step_ms": step_s * 1e3,
        "overhead_ms": overhead,
        "overhead_frac": {k: v / emulated_ms for k, v in overhead.items()},
        # the same CPU against the real, uncompressed step the plan stands for (its predicted modelled seconds):
        # the framework's share at full scale of its work done once per step. Work driven by the clock (polls,
        # heartbeats) costs per second, so at full scale it is paid over the whole real step: two runs at two
        # time_scales separate the two (docs/scale.md, "Overhead at full scale")
        "real_step_ms": mp.predicted_step_s * 1e3,
        "overhead_frac_real": {k: v / (mp.predicted_step_s * 1e3) for k, v in overhead.items()},
        "overhead_frac_real_total": sum(v for v in overhead.values() if not math.isnan(v)) / (mp.predicted_step_s * 1e3),
        "rollout_mode": mp.rollout_mode,
        "predicted_samples_per_s": mp.predicted_samples_per_s,
        "measured_samples_per_s": measured,
        "error": measured / mp.predicted_samples_per_s - 1,
        "predicted_stage_s": mp.predicted_stage_s,
        "bottleneck": mp.bottleneck,
    }


def run_mode_config(
    cfg: RunConfig, run_dir: Path, mp: ModePlan, time_scale: float, steps: int, say: Callable[[str], None]
) -> dict:
    """Run one mode's config with the real launcher (its own output to RUN_DIR/twin.log),
    sampling the control plane's CPU at each step; its figures."""
    from asyncflow.actors.driver.launcher import run

    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def on_step(n: int) -> None:
        say(f"  [{mp.mode}] step {n}/{steps}  ({time.monotonic() - started:.0f} s)")

    sampler = CpuSampler(run_dir, on_step)
    log = run_dir / "twin.log"
    with open(log, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        sampler.start()
        try:
            run(cfg, run_dir)
        except BaseException:
            sampler.stop()
            raise
        sampler.stop()
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if len(metrics) < WARMUP_STEPS + 2:
        raise RuntimeError(f"{mp.mode}: {len(metrics)} steps in {run_dir / 'metrics.jsonl'} (see {log})")
    from asyncflow.cli.runs import load_trace

    try:
        weight_s = weight_time_s(load_trace(run_dir / "trace.json"))
    except (OSError, ValueError, KeyError):
        weight_s = []
    weights_ms = _trace_ms_per_step(run_dir / "trace.json", len(metrics))["weights_ms"]
    out = figures(metrics, sampler.marks, time_scale, weights_ms, mp, weight_s)
    out["wall_s"] = round(time.monotonic() - started, 1)
    out["processes"] = _processes(log)
    return out


def _processes(log: Path) -> int:
    m = re.search(r"starting (\d+) processes", log.read_text()) if log.exists() else None
    return int(m.group(1)) if m else 0


def say_stderr(line: str) -> None:
    print(line, file=sys.__stderr__, flush=True)


def run_mode_process(cfg_path: Path, run_dir: Path, mp: ModePlan, time_scale: float, steps: int) -> dict:
    """``run_mode_config`` in a process of its own (``python -m asyncflow.bench.twin``), as
    ``afctl up`` runs one run per process: each mode's driver starts with nothing held by
    the one before (sockets, threads). Its progress lines go to this process's stderr; its
    figures come back through RUN_DIR/twin.json."""
    import subprocess

    import asyncflow

    root = str(Path(asyncflow.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    run_dir.mkdir(parents=True, exist_ok=True)
    result = run_dir / "twin.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "asyncflow.bench.twin", str(cfg_path), str(run_dir)]
    cmd += [msgspec.json.encode(mp).decode(), repr(time_scale), str(steps)]
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL)
    if done.returncode != 0 or not result.exists():
        log = run_dir / "twin.log"
        tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
        raise RuntimeError(f"exit status {done.returncode}{': ' + tail[0] if tail else ''}")
    return json.loads(result.read_text())


def _main(argv: list[str]) -> int:
    """``python -m asyncflow.bench.twin CONFIG RUN_DIR MODE_PLAN_JSON TIME_SCALE STEPS``."""
    from asyncflow.config.load import load_config

    cfg_path, run_dir, plan, scale, steps = argv
    mp = msgspec.json.decode(plan, type=ModePlan)
    figs = run_mode_config(load_config(cfg_path), Path(run_dir), mp, float(scale), int(steps), say_stderr)
    (Path(run_dir) / "twin.json").write_text(json.dumps(figs))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))


def report(model: str, hardware: str, npus: int, wl: Workload, time_scale: float, results: dict[str, dict]) -> dict:
    """The twin's JSON: the workload, each mode's figures and the speedups, measured and predicted."""
    out: dict = {
        "model": model,
        "hardware": hardware,
        "npus": npus,
        "time_scale": time_scale,
        "workload": {
            "prompts_per_step": wl.prompts_per_step,
            "group": wl.samples_per_prompt,
            "prompt_tokens": wl.prompt_len_tokens,
            "response_tokens_mean": wl.response_len_tokens,
            "response_tokens_max": wl.max_response_len_tokens,
            "staleness": wl.staleness,
            "reference": wl.use_reference,
        },
        "modes": results,
    }
    for other in ("sync", "colocated"):
        if "async" in results and other in results:
            a, o = results["async"], results[other]
            out[f"speedup_async_over_{other}"] = a["measured_samples_per_s"] / o["measured_samples_per_s"]
            out[f"predicted_speedup_async_over_{other}"] = a["predicted_samples_per_s"] / o["predicted_samples_per_s"]
    return out


def table(rep: dict) -> list[str]:
    """The side-by-side lines ``afctl twin`` prints."""
    modes = [m for m in MODES if m in rep["modes"]]
    res = rep["modes"]
    wl = rep["workload"]
    head = f"{'':<34}" + "".join(f"{m:>14}" for m in modes)
    lines = [
        "",
        f"twin: {rep['model']} on {rep['npus']} {rep['hardware']}, {wl['prompts_per_step']} prompts x {wl['group']}, "
        f"prompt {wl['prompt_tokens']} / response {wl['response_tokens_mean']} mean, {wl['response_tokens_max']} cap tokens, "
        f"time_scale {rep['time_scale']:.3g}",
        head,
        "-" * len(head),
    ]

    def row(label: str, cell) -> None:
        lines.append(f"{label:<34}" + "".join(f"{cell(res[m]):>14}" for m in modes))

    row("rollout", lambda r: r.get("rollout", "unit"))
    row("rollout replicas x tp", lambda r: f"{r['replicas']} x {r['rollout_tp']}")
    row("train devices", lambda r: str(r["train_devices"]))
    row("planner's rollout model", lambda r: r.get("rollout_mode", ""))
    row("emulated step, ms (planner)", lambda r: f"{r['emulated_step_ms']:.0f}")
    row("measured step, ms", lambda r: f"{r['measured_step_ms']:.0f}")
    for part in ("queue", "weights", "directory", "driver"):
        row(f"overhead {part}, ms/step", lambda r, p=part: f"{r['overhead_ms'][p]:.1f}")
        row("  of the emulated step", lambda r, p=part: f"{100 * r['overhead_frac'][p]:.2f}%")
        row("  of the real step (per-step work)", lambda r, p=part: f"{100 * r['overhead_frac_real'][p]:.3f}%")
    row("overhead, of the real step (per-step)", lambda r: f"{100 * r['overhead_frac_real_total']:.3f}%")
    row("driver's open fds (max)", lambda r: f"{r.get('driver_fds_max', math.nan):.0f}")
    row("weight time, ms/version (planner)", lambda r: f"{r.get('predicted_weight_ms', math.nan):.0f}")
    row("weight time, ms/version (measured)", lambda r: f"{r.get('weight_ms', math.nan):.0f}")
    row("predicted samples/s (modelled)", lambda r: f"{r['predicted_samples_per_s']:.2f}")
    row("measured samples/s (modelled)", lambda r: f"{r['measured_samples_per_s']:.2f}")
    row("error", lambda r: f"{100 * r['error']:+.1f}%")
    for other in ("sync", "colocated"):
        if f"speedup_async_over_{other}" in rep:
            lines.append(
                f"async / {other}: {rep[f'speedup_async_over_{other}']:.2f}x measured, "
                f"{rep[f'predicted_speedup_async_over_{other}']:.2f}x predicted"
            )
    lines.append(
        "overheads: queue = CPU of the queue host and shards; weights = the trainer's sync_weights (export, digest, "
        "publish); directory = its threads' CPU; driver = the rest of the driver process's CPU. Of the real step: "
        "the same CPU ms against the planner's uncompressed step (modelled seconds), right for work done once per "
        "step; work driven by the clock (polls, heartbeats) is paid per second at full scale: rerun at another "
        "--time-scale to separate the two (docs/scale.md, 'Overhead at full scale')"
    )
    return lines
