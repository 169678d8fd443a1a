"""``[gateway]``: the OpenAI-compatible endpoint served from a rollout replica."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from asyncflow.config._section import Section
from asyncflow.core.schema import Refused
from asyncflow.engines.config import (
    Count,
    NonNegInt,
    PosFloat,
    Seconds,
)


class GatewayConfig(Section):
    """An OpenAI-compatible HTTP endpoint served by one rollout replica (docs/gateway.md):
    agent programs call ``/v1/chat/completions``; the gateway records each session's
    token ids and log-probs exactly as the model produced them."""

    enabled: Annotated[bool, Meta(description="Serve the gateway from rollout replica ``replica``.")] = False
    host: Annotated[
        str,
        Meta(
            description="Address the HTTP server binds. Loopback (127.0.0.1, the default) needs no token; any other address "
            "needs the cluster secret ([cluster.transport] secret or ASYNCFLOW_SECRET), which clients send as their api_key "
            "(``Authorization: Bearer <secret>``). The secret travels in clear text over HTTP: use it on trusted networks only."
        ),
    ] = "127.0.0.1"
    port: Annotated[
        int, Meta(ge=0, le=65535, description="TCP port; 0 picks a free one (written to ``RUN_DIR/gateway.json`` and the log).")
    ] = 8000
    replica: Annotated[NonNegInt, Meta(description="Index of the rollout replica that serves it (``rollout.<replica>``).")] = 0
    all_replicas: Annotated[
        bool,
        Meta(
            description="Every rollout replica serves the gateway (``replica`` is then ignored), behind one URL that the "
            "driver serves on ``host:port``: each session goes to one replica at its first request (its group's, else the "
            "least loaded) and stays there, so its prefix stays where it was run; while that replica is down (restarting) "
            "its requests get a retryable 503, and after ``session_move_after_s`` the session goes on on a live replica "
            "(docs/gateway.md, Several replicas)."
        ),
    ] = False
    require_secret: Annotated[
        bool, Meta(description="Ask for the cluster secret on loopback too (off loopback it is always asked for).")
    ] = False
    max_new_tokens: Annotated[
        Count | None,
        Meta(
            description="Most tokens one request may generate (a request's max_tokens is capped by it); None: "
            "[rollout.sampling] max_new_tokens."
        ),
    ] = None
    max_sessions: Annotated[
        Count,
        Meta(
            description="Sessions kept in memory; beyond it the oldest finished (rewarded) session is dropped, then the oldest "
            "anonymous one (a request that named no session) not taking a turn, and a new session is refused (HTTP 429) "
            "while all of them are named open ones."
        ),
    ] = 1024
    max_batch: Annotated[
        Count,
        Meta(
            description="Most requests (of different sessions, waiting at the same time) generated together in one engine call; "
            "1: one at a time."
        ),
    ] = 64
    request_timeout_s: Annotated[
        Seconds,
        Meta(
            description="With ``all_replicas``: how long the front waits for a replica's answer to one request "
            "(generation included) before it answers 504 (a frozen or stuck replica); the replica keeps its sessions.",
        ),
    ] = 600.0
    session_move_after_s: Annotated[
        PosFloat,
        Meta(
            description="With ``all_replicas``: how long a replica may stay unreachable before its sessions go on on live "
            "replicas, loaded from its journal in RUN_DIR exactly as recorded (a replica the online planner removed: at "
            "once). Until then its requests get a retryable 503, and a replica restarted in place keeps its sessions. "
            "Longer than ``cluster.restart_backoff_s``; a huge value (1e9) lets sessions wait for their replica however "
            "long (docs/gateway.md, Several replicas)."
        ),
    ] = 300.0
    max_request_bytes: Annotated[
        Count,
        Meta(
            description="Largest request body the gateway reads; a larger one gets HTTP 413 as it arrives (by its "
            "Content-Length, or once the stream passes the limit), never held whole in memory."
        ),
    ] = 1 << 20
    train: Annotated[
        bool,
        Meta(
            description="Train on the gateway's rewarded sessions: the run's data comes from outside (agent programs "
            "calling the gateway) instead of ``[data]``. Each rewarded session becomes one row of the queue's train task "
            "(token ids, loss mask, log-probs, per-token versions); no prompt loader, no reward role, and the rollout "
            "replica generates only for the gateway. Sessions sharing a group key (the ``X-Group-Id`` header or the "
            "reward's ``group`` field) form a GRPO group of ``algorithm.group_size``; a session without one gets a "
            "leave-one-out baseline over the step's other lone sessions (docs/gateway.md, Training on sessions)."
        ),
    ] = False
    reward_timeout_s: Annotated[
        Seconds,
        Meta(
            description="With ``train``: a session not rewarded within this many seconds of its last turn, or a keyed "
            "group not complete within it of its first reward, is dropped and counted (``gateway/sessions_unrewarded``, "
            "``gateway/sessions_group_incomplete`` in RUN_DIR/gateway/stats.json and the replica's metrics).",
        ),
    ] = 600.0
    num_sessions: Annotated[
        Count | None,
        Meta(
            description="With ``train``: end the run once this many sessions are trained; ``train.num_steps`` becomes "
            "num_sessions / (train.prompts_per_step x algorithm.group_size), which must divide it. None: "
            "``train.num_steps`` steps (or ``until_stopped``)."
        ),
    ] = None
    until_stopped: Annotated[
        bool,
        Meta(
            description="With ``train``: train until the run is stopped (Ctrl-C or SIGTERM to ``afctl up``); "
            "``train.num_steps`` is then ignored (set to a bound no run reaches)."
        ),
    ] = False
    pace: Annotated[
        bool,
        Meta(
            description="With ``train``: hold back new sessions while the sessions started and not yet trained would "
            "make them older than ``workflow.staleness`` by the time they are trained: a new session's first request "
            "waits (at most ``pace_wait_s``) instead of being generated and then discarded as stale. Sessions under way "
            "are never held. False: every session starts at once, and the trainer discards the stale ones "
            "(docs/gateway.md, Pacing)."
        ),
    ] = True
    pace_wait_s: Annotated[
        Seconds,
        Meta(
            description="With ``pace``: the longest a new session's first request is held; then it gets HTTP 503 with "
            "``Retry-After`` (the openai client sends it again by itself, but only ``max_retries`` times: 2 by default). "
            "Shorter than the agent's client timeout (the openai client's: 600 s) and longer than a few trainer steps "
            "(a SmolLM2 step on 2 cores takes about a minute)."
        ),
    ] = 300.0
    idle_end_s: Annotated[
        Seconds | None,
        Meta(
            description="With ``train``: a run whose trainer has waited this many seconds without a rewarded session "
            "reaching the queue (the agents stopped sending) saves a checkpoint, says so and ends, before "
            "``num_sessions``. Longer than an agent's slowest episode; None: wait for sessions however long. Not with "
            "``until_stopped``, which waits by design."
        ),
    ] = 600.0

    @property
    def trains(self) -> bool:
        """The run trains on the gateway's rewarded sessions: no prompt loader, no reward
        role, no rollout task (``RunConfig.data_from_gateway``)."""
        return self.enabled and self.train

    def check(self, run: object) -> None:
        if not self.enabled:
            if self.train:
                raise Refused("train", "sessions train only when the gateway serves: set rollout.gateway.enabled = true")
            return
        if self.host.startswith("[") or self.host.endswith("]"):
            raise Refused("host", f"give the address without brackets ({self.host.strip('[]')!r}); brackets belong in URLs")
        if self.train and self.num_sessions is not None and self.until_stopped:
            raise Refused("num_sessions", "give num_sessions or until_stopped = true, not both")
        if not self.train and (self.num_sessions is not None or self.until_stopped):
            key = "num_sessions" if self.num_sessions is not None else "until_stopped"
            raise Refused(key, "ends a run whose data comes from the gateway: set rollout.gateway.train = true, or unset it")

    def steps(self, num_steps: int, sessions_per_step: int) -> int:
        """The run's trainer steps: ``num_sessions`` / sessions per step, a bound no run reaches
        with ``until_stopped``, else ``num_steps`` (``train.num_steps``)."""
        if not self.trains:
            return num_steps
        if self.until_stopped:
            return UNTIL_STOPPED_STEPS
        if self.num_sessions is not None:
            return self.num_sessions // sessions_per_step
        return num_steps


UNTIL_STOPPED_STEPS = 1 << 40
"""``train.num_steps`` of a run that trains on sessions until it is stopped."""
