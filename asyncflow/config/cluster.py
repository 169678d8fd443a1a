"""``[cluster]`` and ``[logging]``: processes, device kind, transport and what a run writes.
(Which devices each role's instances see is its own section's ``devices``.)"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from asyncflow.config._section import Section
from asyncflow.core.schema import ConfigError, Refused
from asyncflow.core.transport import TransportConfig
from asyncflow.engines.config import (
    Count,
    Delay,
    NonNegInt,
    PosFloat,
    Seconds,
)

RAY_RESOURCE_STEP = 0.0001
"""Ray's resolution of a resource quantity (its fixed-point unit)."""


class ClusterConfig(Section):
    """Where processes run."""

    launcher: Annotated[
        Literal["local", "ray"], Meta(description="local: every process on this machine. ray: placed by a running Ray cluster.")
    ] = "local"
    max_resumes: Annotated[
        NonNegInt,
        Meta(
            description="When a process that cannot be restarted alone dies (queue, shard, loader, a trainer rank) or its node is "
            "lost, stop cleanly and resume from the last checkpoint, up to this many times per `afctl up` (0: stop and "
            "print the resume command). Rollout, reward, reference and custom-role processes are restarted in place "
            "(within ``max_restarts_per_role``)."
        ),
    ] = 0
    max_restarts_per_role: Annotated[
        NonNegInt,
        Meta(
            description="Restarts of one role's processes (rollout, reward, reference, or a custom role; its workers share the count) "
            "allowed within any ``restart_window_s``. A worker that dies during its own restart counts again. One more "
            "death stops the run cleanly, which ``max_resumes`` then resumes from the last checkpoint. 0: never restart."
        ),
    ] = 10
    restart_window_s: Annotated[
        PosFloat, Meta(description="The window of ``max_restarts_per_role``, in seconds: older restarts no longer count.")
    ] = 300.0
    restart_backoff_s: Annotated[
        Delay,
        Meta(
            description="A role's first restart in the window is immediate; the next waits this long, and each one after twice as long "
            "as the one before (at most 60 s)."
        ),
    ] = 1.0
    device: Annotated[Literal["cpu", "cuda", "npu"], Meta(description="Device kind of rollout and training.")] = "cpu"
    transport: Annotated[
        TransportConfig, Meta(description="nng transport of the actors (scheme ipc on one host, tcp across hosts).")
    ] = msgspec.field(default_factory=TransportConfig)
    threads_per_process: Annotated[Count, Meta(description="torch intra-op threads per worker process (cpu).")] = 1
    actors_per_process: Annotated[
        Count,
        Meta(
            description="Rollout replicas per process host: replicas rollout.0 .. are packed this many to a process "
            "(``rollout.pack.<k>``), each still an actor of its own (its name, its listener, its rows). Only with "
            'rollout.engine.type = "emulated", whose replicas hold no model: a real replica has torch threads and device '
            "memory of its own. A packed process that dies takes all its replicas with it; each is requeued and restarted "
            "(docs/scale.md)."
        ),
    ] = 1
    pin_trainer_cores: Annotated[
        NonNegInt,
        Meta(
            description="Async mode, local launcher: this many of the cores the driver may use (the first ones) go to the trainer's "
            "processes alone; every other process shares the rest (Linux CPU affinity). On a machine the run has to "
            "itself, whose few cores every role shares, the trainer (the critical path of an async step) then never waits "
            "for a core (docs/performance.md); where other jobs load the machine it hurts (the trainer is held to its busy "
            "cores). 0: the OS places every process on every core. Sync mode ignores it: its phases take turns, each may "
            "use every core."
        ),
    ] = 0
    pin_only_when_idle: Annotated[
        bool,
        Meta(
            description="With pin_trainer_cores: pin only if the machine's cores were nearly idle as the run started (under 20% "
            "busy over 0.3 s, /proc/stat), so a run started beside other jobs leaves its processes to the OS; the run prints "
            "its decision and summary.json records it (pinned_trainer_cores). false: pin whatever the load."
        ),
    ] = True
    rollout_devices: Annotated[
        list[NonNegInt], Meta(description="Deprecated: write ``[rollout] devices`` (read into it, with a warning).")
    ] = msgspec.field(default_factory=list)
    train_devices: Annotated[
        list[NonNegInt], Meta(description="Deprecated: write ``[train] devices`` (read into it, with a warning).")
    ] = msgspec.field(default_factory=list)
    reference_devices: Annotated[
        list[NonNegInt], Meta(description="Deprecated: write ``[reference] devices`` (read into it, with a warning).")
    ] = msgspec.field(default_factory=list)
    reward_model_devices: Annotated[
        list[NonNegInt], Meta(description="Deprecated: write ``[reward_model] devices`` (read into it, with a warning).")
    ] = msgspec.field(default_factory=list)
    python_path: Annotated[
        list[str],
        Meta(
            description="Directories (relative to the config file, like every path in it, or absolute) added to every process's "
            "PYTHONPATH, so custom roles and rewards in your own modules import."
        ),
    ] = msgspec.field(default_factory=list)
    ray_address: Annotated[str, Meta(description="Ray cluster address (launcher = ray); empty: RAY_ADDRESS.")] = ""
    ray_cpus_per_host: Annotated[
        PosFloat,
        Meta(
            description="launcher = ray: the CPU each process host reserves from Ray, for placement only (its threads come from "
            "``threads_per_process``); a fraction, so that light processes do not wait for whole cores. A run of N hosts "
            "needs N x this many of the CPUs the Ray cluster declares (``ray start --num-cpus``): a run that needs more is "
            "refused before any host starts, with the figures (docs/multi-node.md)."
        ),
    ] = 0.1

    def check(self, run: object) -> None:
        if self.ray_cpus_per_host < RAY_RESOURCE_STEP:
            raise Refused(
                "ray_cpus_per_host", f"Ray counts CPU in steps of {RAY_RESOURCE_STEP:g}: use {RAY_RESOURCE_STEP:g} or more"
            )
        if self.pin_trainer_cores and self.launcher != "local":
            raise Refused("pin_trainer_cores", "pins cores of this machine: use it with launcher = 'local', or set it to 0")
        try:
            self.transport.validate()
        except ValueError as exc:  # the transport names its keys already
            raise ConfigError(str(exc).replace("[cluster.transport] ", "cluster.transport.")) from None


MOVED_DEVICES = {
    "rollout_devices": "rollout",
    "train_devices": "train",
    "reference_devices": "reference",
    "reward_model_devices": "reward_model",
}
"""The device lists that moved from ``[cluster]`` into their role's section (its ``devices``):
old key -> section. The old keys are still read, with a warning (``RunConfig.__post_init__``)."""


class LoggingConfig(Section):
    """What the run writes besides metrics.jsonl."""

    progress: Annotated[bool, Meta(description="Print one progress line per trainer step.")] = True
    tensorboard: Annotated[bool, Meta(description="Write TensorBoard event files (extra: asyncflow[tensorboard]).")] = False
    wandb_project: Annotated[str, Meta(description="Log to Weights & Biases under this project (extra: asyncflow[wandb]).")] = ""
    hang_timeout_s: Annotated[
        Seconds,
        Meta(
            description="If no trainer step completes for this long, or for 3 x the slowest step so far (before the first: 3 x "
            "the preflight's estimate of a step) when that is longer, print what every role is doing and write every "
            "process's Python stacks to ``RUN_DIR/logs/stall-<n>.txt`` (docs/faults.md, 'Stalls')."
        ),
    ] = 300.0
    spans: Annotated[bool, Meta(description="Record what every role does over time into RUN_DIR/trace.json (afctl trace).")] = (
        True
    )
    trace_every_s: Annotated[
        Delay,
        Meta(
            description="Append the roles' new spans to RUN_DIR/trace.json this often during the run (afctl trace on a "
            "live run; also whenever 20,000 are held); 0: only then and at the end."
        ),
    ] = 30.0
    samples_every: Annotated[
        NonNegInt,
        Meta(
            description="Every N trainer steps (from step 0), write ``samples_per_step`` of the step's rows as text to "
            "RUN_DIR/samples.jsonl: prompt, response, reward, how it ended, policy version (docs/metrics.md, 'What the "
            "model writes'; ``afctl samples RUN_DIR`` prints them as a table); 0: never. Every evaluation's completions "
            "(``[eval]``) go to RUN_DIR/eval_samples.jsonl whatever this says."
        ),
    ] = 1
    samples_per_step: Annotated[
        Count,
        Meta(
            description="Rows written to RUN_DIR/samples.jsonl at each ``samples_every`` (a few hundred bytes each: "
            "2 rows a step keep the file small over thousands of steps)."
        ),
    ] = 2
