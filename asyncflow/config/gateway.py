"""``[gateway]``: the OpenAI-compatible endpoint served from a rollout replica."""

from __future__ import annotations

import typing
from typing import Annotated

from msgspec import Meta

from asyncflow.config._section import Section
from asyncflow.core.schema import Refused
from asyncflow.core.transport import SECRET_ENV, is_loopback
from asyncflow.engines.config import (
    Count,
    NonNegInt,
)

if typing.TYPE_CHECKING:
    from asyncflow.config.run import RunConfig


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
    max_request_bytes: Annotated[
        Count,
        Meta(
            description="Largest request body the gateway reads; a larger one gets HTTP 413 as it arrives (by its "
            "Content-Length, or once the stream passes the limit), never held whole in memory."
        ),
    ] = 1 << 20

    def check(self, run: RunConfig) -> None:
        if not self.enabled:
            return
        if self.host.startswith("[") or self.host.endswith("]"):
            raise Refused("host", f"give the address without brackets ({self.host.strip('[]')!r}); brackets belong in URLs")
        if self.replica >= run.rollout.num_replicas:
            raise Refused(
                "replica", f"there are {run.rollout.num_replicas} rollout replicas: use 0..{run.rollout.num_replicas - 1}"
            )
        if (not is_loopback(self.host) or self.require_secret) and not run.cluster.transport.secret_bytes():
            raise Refused(
                "host" if not is_loopback(self.host) else "require_secret",
                f"the gateway asks for the cluster secret here and none is set: set [cluster.transport] secret or the "
                f"{SECRET_ENV} environment variable (clients send it as their api_key), or serve on host = '127.0.0.1'",
                self.host if not is_loopback(self.host) else self.require_secret,
            )
