"""The rules of ``cluster.toml`` that read more than one section, as plain functions.

Each function takes exactly the sections it reads and raises ``Refused(key, fix)`` with the
key's full dotted name (``"cluster.pin_trainer_cores"``). ``RunConfig.check`` (run.py) calls
them all, in the order of the sections; ``core.schema.check_tree`` runs it after every
section's own ``check`` (so a rule here may rely on those) and adds the value to the message.
A rule within one section is that section's ``check``: no section module imports the whole
run's type, and a key's refusal lives in its section's module or here.
"""

from __future__ import annotations

from asyncflow.config.algorithm import AlgorithmConfig
from asyncflow.config.cluster import MOVED_DEVICES, ClusterConfig
from asyncflow.config.env import EnvConfig
from asyncflow.config.model import DataConfig, ModelConfig
from asyncflow.config.names import reserved as reserved_role_name
from asyncflow.config.planner import PlannerConfig
from asyncflow.config.roles import (
    REWARD_MODEL_COLUMN,
    CriticConfig,
    ReferenceConfig,
    RewardConfig,
    RewardModelConfig,
    RoleEntry,
    RolloutConfig,
    reward_columns,
)
from asyncflow.config.train import EvalConfig, TrainConfig
from asyncflow.config.workflow import QueueConfig, WorkflowConfig
from asyncflow.core.schema import Refused
from asyncflow.core.transport import SECRET_ENV, is_loopback


def check_moved_devices(
    cluster: ClusterConfig,
    rollout: RolloutConfig,
    train: TrainConfig,
    reference: ReferenceConfig,
    reward_model: RewardModelConfig,
) -> None:
    """A device list given both under its old ``[cluster]`` key and as its role's section's
    ``devices`` (given under the old key alone, ``RunConfig.__post_init__`` moves it)."""
    sections = {"rollout": rollout.devices, "train": train.devices, "reference": reference.devices}
    sections["reward_model"] = reward_model.devices
    for old, new in MOVED_DEVICES.items():
        if getattr(cluster, old) and sections[new]:
            raise Refused(
                f"cluster.{old}",
                f"is deprecated and {new}.devices is given too: keep only [{new}] devices (and remove [cluster] {old})",
            )


def check_data_task(data: DataConfig, model: ModelConfig) -> None:
    if not data.path and data.task in ("add2", "add1") and not model.path:
        raise Refused(
            "data.task",
            f"{data.task!r} is a task in words for a real model: set model.path (examples/smollm2.toml, examples/gemma3.toml)",
        )


def check_dynamic_sampling_metric(algorithm: AlgorithmConfig, roles: list[RoleEntry], reward_model: RewardModelConfig) -> None:
    metrics = ["reward", "score", *(column for column, _ in reward_columns(roles, reward_model))]
    if algorithm.dynamic_sampling_metric not in metrics:
        raise Refused("algorithm.dynamic_sampling_metric", f"use one of {metrics} (the reward columns this run has)")


def check_overlong_buffer(algorithm: AlgorithmConfig, rollout: RolloutConfig) -> None:
    max_new_tokens = rollout.sampling.max_new_tokens
    if algorithm.overlong_buffer >= max_new_tokens:
        raise Refused(
            "algorithm.overlong_buffer",
            f"the buffer is the last tokens before rollout.sampling.max_new_tokens ({max_new_tokens}): use 0 (off) "
            f"or a value below {max_new_tokens}",
        )


def check_gateway_replica(rollout: RolloutConfig) -> None:
    if rollout.gateway.enabled and rollout.gateway.replica >= rollout.num_replicas:
        raise Refused(
            "rollout.gateway.replica",
            f"there are {rollout.num_replicas} rollout replicas: use 0..{rollout.num_replicas - 1}",
        )


def check_gateway_secret(rollout: RolloutConfig, cluster: ClusterConfig) -> None:
    gw = rollout.gateway
    if gw.enabled and (not is_loopback(gw.host) or gw.require_secret) and not cluster.transport.secret_bytes():
        raise Refused(
            "rollout.gateway.host" if not is_loopback(gw.host) else "rollout.gateway.require_secret",
            f"the gateway asks for the cluster secret here and none is set: set [cluster.transport] secret or the "
            f"{SECRET_ENV} environment variable (clients send it as their api_key), or serve on host = '127.0.0.1'",
        )


def check_gateway_restarts(rollout: RolloutConfig, cluster: ClusterConfig) -> None:
    gw, backoff = rollout.gateway, cluster.restart_backoff_s
    if gw.enabled and gw.all_replicas and gw.session_move_after_s <= backoff:
        raise Refused(
            "rollout.gateway.session_move_after_s",
            f"the Supervisor waits cluster.restart_backoff_s = {backoff:g} s (and longer each time after) before it "
            f"restarts a replica that died again, which would find its sessions moved: raise it above {backoff:g} "
            "(minutes: a restart loads the model), or lower cluster.restart_backoff_s",
        )


def check_gateway_training(
    rollout: RolloutConfig,
    train: TrainConfig,
    algorithm: AlgorithmConfig,
    env: EnvConfig,
    reward_model: RewardModelConfig,
) -> None:
    """What a run that trains on sessions cannot combine with, each named with its fix."""
    gw = rollout.gateway
    if not gw.trains:
        return
    per_step = train.prompts_per_step * algorithm.group_size
    if gw.num_sessions is not None and gw.num_sessions % per_step:
        raise Refused(
            "rollout.gateway.num_sessions",
            f"a step trains train.prompts_per_step x algorithm.group_size = {per_step} sessions: use a multiple of "
            f"{per_step} (e.g. {max(1, round(gw.num_sessions / per_step)) * per_step})",
        )
    # what the trainer's step of sessions cannot do is its source's to say (actors/trainer/sources/sessions.py)
    refusals = (
        (bool(env.path), "unset env.path (the agent program is the environment)"),
        (reward_model.enabled, "set reward_model.enabled = false (a session's reward comes by the reward route)"),
        (
            rollout.num_replicas > 1 and not gw.all_replicas,
            f"set rollout.gateway.all_replicas = true (every replica serves the gateway behind one URL, each session "
            f"on one replica), or rollout.num_replicas = 1 (one replica serves it; the other "
            f"{rollout.num_replicas - 1} would idle)",
        ),
    )
    for refused, fix in refusals:
        if refused:
            raise Refused("rollout.gateway.train", f"a run that trains on gateway sessions cannot do this: {fix}")


def check_reward_placement(reward: RewardConfig, env: EnvConfig) -> None:
    if reward.placement == "rollout" and env.path:
        raise Refused("reward.placement", "the rollout scores only single-turn rows: with [env] path set, use placement = 'role'")


def check_something_scores(reward: RewardConfig, env: EnvConfig, rollout: RolloutConfig, roles: list[RoleEntry]) -> None:
    scored_outside = rollout.gateway.trains  # sessions' rewards come by the gateway's reward route
    if not reward.functions and not env.path and not scored_outside and not any(r.reward_column for r in roles):
        raise Refused(
            "reward.functions",
            "nothing would score the responses: name a reward function (or set [env] path, whose reward counts)",
        )


def check_tiny_reward_model(reward_model: RewardModelConfig, model: ModelConfig) -> None:
    rm = reward_model
    if rm.enabled and not rm.path and rm.kind == "classifier" and model.path:
        raise Refused(
            "reward_model.path",
            "the tiny reward model reads the tiny model's tokens only: give a reward model of your own "
            "(reward_model.path) for model.path's model",
        )


def check_critic_fsdp(critic: CriticConfig, train: TrainConfig, algorithm: AlgorithmConfig) -> None:
    ranks = train.num_ranks
    if ranks > 1 and train.engine.fsdp and algorithm.needs_critic and not critic.engine.fsdp:
        raise Refused("critic.engine.fsdp", f"the PPO critic trains on the same {ranks} ranks: set [critic.engine] fsdp = true")


def check_eval(eval: EvalConfig, train: TrainConfig, rollout: RolloutConfig, workflow: WorkflowConfig) -> None:
    if eval.where == "process" and workflow.weight_transport not in ("nng", "local"):  # the local sender serves nng too
        raise Refused(
            "eval.where",
            f"the evaluator fetches each version over nng; with workflow.weight_transport = {workflow.weight_transport!r} "
            "use where = 'trainer' (or 'auto')",
        )
    if eval.at_start and train.num_ranks > 1:
        raise Refused("eval.at_start", "needs the whole starting weights in one process: not with train.num_ranks > 1")
    if eval.every_steps and eval.mode == "pass_at_k" and rollout.sampling.temperature == 0:
        raise Refused(
            "eval.mode",
            "pass_at_k samples at rollout.sampling.temperature, which is 0 (greedy): every "
            "sample would be the same; use mode = 'greedy' or a temperature above 0",
        )


def check_queue_capacity(queue: QueueConfig, train: TrainConfig, algorithm: AlgorithmConfig) -> None:
    rows = algorithm.rows_per_step(train.prompts_per_step)
    if queue.capacity_rows and queue.capacity_rows < rows:
        raise Refused("queue.capacity_rows", f"must hold at least one global batch ({rows} rows) or be 0 (automatic)")
    headroom = algorithm.refill_headroom_rows(train.prompts_per_step)
    if queue.capacity_rows and headroom and queue.capacity_rows < rows + headroom:
        raise Refused(
            "queue.capacity_rows",
            f"with algorithm.dynamic_sampling_max_rounds > 0 the queue keeps {headroom} rows free for refill rounds: "
            f"use at least {rows + headroom} or 0 (automatic)",
        )


def check_pinned_cores(cluster: ClusterConfig, train: TrainConfig, workflow: WorkflowConfig) -> None:
    threads = train.engine.num_threads or cluster.threads_per_process
    if cluster.pin_trainer_cores and workflow.mode == "async" and threads > cluster.pin_trainer_cores * train.num_ranks:
        # more OpenMP threads than cores: each barrier waits for a descheduled thread
        raise Refused(
            "cluster.pin_trainer_cores",
            f"the trainer would run {threads} threads per rank on {cluster.pin_trainer_cores} pinned core(s) for "
            f"{train.num_ranks} rank(s): set train.engine.num_threads to at most the pinned cores per rank, or "
            "pin_trainer_cores = 0 (nothing pinned: the trainer's threads share every core; docs/real-model.md, "
            "'How the processes share the cores')",
        )


def check_packing(cluster: ClusterConfig, rollout: RolloutConfig, planner: PlannerConfig) -> None:
    if cluster.actors_per_process == 1:
        return
    if rollout.engine.type != "emulated":
        raise Refused(
            "cluster.actors_per_process",
            f"packs rollout replicas, which is safe only for the emulated engine (a {rollout.engine.type} replica "
            'holds a model, torch threads and device memory of its own): set rollout.engine.type = "emulated" and '
            'train.engine.type = "emulated", or actors_per_process = 1',
        )
    if planner.online:
        raise Refused(
            "cluster.actors_per_process", "the online planner moves one replica process at a time: set planner.online = false"
        )
    if rollout.gateway.enabled:
        raise Refused("cluster.actors_per_process", "a gateway serves from one replica's process: disable rollout.gateway")


def check_online_planner(planner: PlannerConfig, rollout: RolloutConfig, train: TrainConfig) -> None:
    if planner.online and planner.max_rollout_replicas < rollout.num_replicas:  # a limit of the online planner alone
        raise Refused(
            "planner.max_rollout_replicas",
            f"the online planner starts from rollout.num_replicas = {rollout.num_replicas} replicas: raise it to at least that",
        )
    if planner.online and train.num_ranks > 1:
        raise Refused(
            "planner.online",
            "the online planner moves threads and replicas for a one-rank trainer only: set it to false, or train.num_ranks = 1",
        )


def check_custom_roles(roles: list[RoleEntry], reward_model: RewardModelConfig) -> None:
    """Rules across ``[[roles]]`` entries, and between them and the built-in roles."""
    names = [r.name for r in roles]
    if len(names) != len(set(names)):
        raise Refused("roles.name", "role names must be unique", names)
    for r in roles:
        if reserved_role_name(r.name):
            raise Refused("roles.name", "this name belongs to a built-in role; choose another", r.name)
        if r.reward_column == REWARD_MODEL_COLUMN and reward_model.enabled:
            raise Refused("roles.reward_column", "the reward-model role puts this column: choose another", r.reward_column)
        if r.reward_column and not r.task:
            raise Refused(
                "roles.reward_column",
                f"role {r.name!r} must also set `task` (the queue task it reads rows from)",
                r.reward_column,
            )
