"""``[train]`` and ``[eval]``: the trainer, and held-out evaluation of its versions."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from asyncflow.config._section import Section
from asyncflow.core.schema import Refused
from asyncflow.engines.config import (
    Count,
    NonNegInt,
    Seconds,
    TrainEngineConfig,
)


class TrainConfig(Section):
    """The trainer (actor update)."""

    engine: Annotated[TrainEngineConfig, Meta(description="Training engine (see engines/config.py).")] = msgspec.field(
        default_factory=TrainEngineConfig
    )
    num_steps: Annotated[Count, Meta(description="Trainer steps (policy versions) in the run.")] = 60
    prompts_per_step: Annotated[
        Count, Meta(description="Prompt groups per global batch (samples per step = this * group_size).")
    ] = 8
    num_ranks: Annotated[
        Count,
        Meta(
            description="Trainer processes (data parallel with FSDP2: needs ``engine.fsdp = true``). Rank 0 reads the batch plan and "
            "publishes weights; every rank reads its own rows from the queue. With ``devices``, give one "
            "device per rank."
        ),
    ] = 1
    dist_port: Annotated[
        int,
        Meta(
            ge=0,
            le=65535,
            description="Port of rank 0's torch.distributed store (0: any free port, published through the directory). Set it when "
            "only some ports are open between nodes.",
        ),
    ] = 0
    dist_timeout_s: Annotated[
        Seconds,
        Meta(
            description="How long trainer ranks wait for each other (rendezvous, each collective) before failing: a rank whose peer "
            "vanished fails after this, it never hangs."
        ),
    ] = 600.0
    checkpoint_every: Annotated[
        NonNegInt, Meta(description="Save a Hugging Face checkpoint and the queue state every N steps (0: at the end only).")
    ] = 0
    keep_checkpoints: Annotated[
        NonNegInt,
        Meta(
            description="Keep the newest N complete checkpoints (``checkpoints/step_*``) and delete older ones after each "
            "save; the best (``checkpoints/best``, ``[eval]``) is kept apart. 0: keep every one. Keep 2 or more so that a "
            "damaged newest checkpoint still has one to fall back to."
        ),
    ] = 0

    devices: Annotated[
        list[NonNegInt],
        Meta(description="Accelerator ids of the trainer: all of them for one rank, one per rank with ``num_ranks > 1``."),
    ] = msgspec.field(default_factory=list)

    def check(self, run: object) -> None:
        ranks = self.num_ranks
        if ranks > 1 and not self.engine.fsdp:
            raise Refused(
                "engine.fsdp", f"train.num_ranks = {ranks} trains data parallel with FSDP2: set [train.engine] fsdp = true"
            )
        if self.prompts_per_step % ranks:
            raise Refused(
                "prompts_per_step", f"every rank trains whole prompt groups: use a multiple of train.num_ranks ({ranks})"
            )
        if ranks > 1 and self.devices and len(self.devices) != ranks:
            raise Refused("devices", f"give one device per trainer rank ({ranks} ids), or none")


class EvalConfig(Section):
    """Evaluation of the policy on held-out prompts during the run (docs/metrics.md,
    ``val/*``), with a private rollout engine holding the weights just published (native,
    or hf for a model the native engine does not implement or with ``rollout.engine.type =
    "hf"``; never vLLM; its KV cache: ``rollout.engine.kv_cache_bytes``, or 64 MiB). Where
    it runs is ``where``: in the trainer's process (the trainer waits for it), or in a
    process of its own, the ``evaluator`` role, while the trainer goes on (the figures reach
    metrics.jsonl a step or more later; ``val/version`` says which version they are of).
    Only trainer rank 0 evaluates or asks for evaluations; the other ranks wait for it. With ``[env] path`` each
    response is a multi-turn episode through the environment, as in training
    (docs/environments.md, "Held-out evaluation"), and ``val/env/*`` are reported too."""

    every_steps: Annotated[
        NonNegInt,
        Meta(
            description="Evaluate after every this many trainer steps and after the last one; 0 disables evaluation (and the held-out "
            "split: every prompt is trained on)."
        ),
    ] = 0
    num_prompts: Annotated[
        Count,
        Meta(
            description="Held-out prompts: this many distinct prompts drawn (with ``data.seed``) from the data file; every row with "
            "one of them is left out of training. The data must have more distinct prompts than this (the built-in ``add`` "
            "task has 100)."
        ),
    ] = 20
    mode: Annotated[
        Literal["greedy", "pass_at_k"],
        Meta(
            description="greedy: one response per prompt at temperature 0. pass_at_k: ``k`` responses per prompt at "
            "``rollout.sampling.temperature``; a prompt passes if any is correct."
        ),
    ] = "greedy"
    k: Annotated[Count, Meta(description="Responses per prompt in pass_at_k mode.")] = 4
    max_new_tokens: Annotated[
        NonNegInt,
        Meta(
            description="Most response tokens (with ``[env] path``: per model turn, as in training); 0: "
            "``rollout.sampling.max_new_tokens``."
        ),
    ] = 0
    correct_reward: Annotated[
        float,
        Meta(
            description="A response counts as correct when its reward (``reward.functions`` with ``reward.weights``; with "
            "``[env] path``, combined with the episode's ``env_reward`` by ``env.reward``, as in training) is at least this. "
            "The built-in tasks (and ``asyncflow.envs.calc:CalcEnv``) give 1.0 to an exact answer."
        ),
    ] = 0.999
    save_best: Annotated[
        bool,
        Meta(
            description="At each evaluation whose ``val/accuracy`` beats every earlier one, save the weights (a Hugging Face "
            "directory, no optimizer) to ``checkpoints/best_<version>`` and point the link ``checkpoints/best`` at it "
            "(``checkpoints/best.json`` says which)."
        ),
    ] = True
    at_start: Annotated[
        bool,
        Meta(
            description="Also evaluate the weights the run starts from (version 0, before any step of a new run): their figures "
            "go into the first step's record as ``val/start_accuracy`` and ``val/start_reward_mean``, and the run's last "
            "line says start -> last. Needs ``every_steps`` > 0 and one trainer rank."
        ),
    ] = False

    where: Annotated[
        Literal["auto", "trainer", "process"],
        Meta(
            description="Where evaluations run. ``trainer``: in the trainer's process, which waits for each (the "
            "figures go into the record of the step just trained). ``process``: in the ``evaluator`` role, a process of "
            'its own that fetches each version from the ``weights`` actor (``workflow.weight_transport = "nng"``) '
            "while the trainer goes on; its threads are ``cluster.threads_per_process``, and for the run's last "
            "evaluation, which the trainer waits for, the trainer's. ``auto``: ``process`` in async mode with the nng "
            "transport, else ``trainer``."
        ),
    ] = "auto"

    def check(self, run: object) -> None:
        if self.at_start and not self.every_steps:
            raise Refused("at_start", "evaluates only with every_steps > 0: set eval.every_steps too")
