"""Start the gateway in the rollout replica that ``[rollout.gateway] replica`` names.

The replica calls ``serve_for_replica`` once it has its engine; the HTTP libraries
(the ``gateway`` extra) are imported only when the gateway is on. The URL goes to the
log and to ``RUN_DIR/gateway.json`` (``{"url": ..., "replica": ..., "trajectories": ...}``).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from asyncflow.core.transport import is_loopback
from asyncflow.gateway.journal import JOURNAL_FILE

log = logging.getLogger(__name__)

TRAJECTORIES_FILE = "gateway/trajectories.jsonl"
"""RUN_DIR/gateway/trajectories.jsonl: one rewarded session per line (docs/gateway.md)."""
STATS_FILE = "gateway/stats.json"
"""RUN_DIR/gateway/stats.json: the feed's counts (``gateway/sessions_*``), rewritten as they change."""


def serve_for_replica(
    cfg,
    replica: int,
    run_dir: str | Path,
    engine,
    tokenizer,
    params,
    engine_lock: threading.Lock,
    secret: bytes,
    *,
    digest=None,
    queue=None,
    group_size: int = 1,
    streamed: bool = False,
):
    """The started Gateway when ``cfg`` (a GatewayConfig) puts it on this replica, else None.
    Its sessions are journaled in RUN_DIR (a restarted replica serves them again);
    ``digest``: the engine's weights digest (read under ``engine_lock``); with
    ``cfg.train``, ``queue`` (a TQClient) is where rewarded sessions go, in groups of
    ``group_size`` by key; ``streamed`` (partial rollout): its requests join the replica's
    generation stream (``batcher.StreamedRequests``)."""
    if not cfg.enabled or replica != cfg.replica:
        return None
    try:
        from asyncflow.gateway.server import Gateway
    except ImportError as exc:
        raise RuntimeError(
            f"[rollout.gateway] enabled = true needs the gateway extra ({exc.name} is missing): pip install -e '.[gateway]'"
        ) from None
    needs_secret = cfg.require_secret or not is_loopback(cfg.host)
    if needs_secret and not secret:
        raise RuntimeError("[rollout.gateway]: the gateway asks for the cluster secret and none is set (ASYNCFLOW_SECRET)")
    if cfg.max_new_tokens is not None:
        import msgspec

        params = msgspec.structs.replace(params, max_new_tokens=cfg.max_new_tokens)
    run = Path(run_dir)
    feed = None
    if cfg.train:
        from asyncflow.gateway.feed import SessionFeed

        feed = SessionFeed(group_size, cfg.reward_timeout_s)
    gateway = Gateway(
        engine,
        tokenizer,
        params,
        engine_lock=engine_lock,
        secret=secret if needs_secret else None,
        trajectories_path=run / TRAJECTORIES_FILE,
        max_sessions=cfg.max_sessions,
        max_batch=cfg.max_batch,
        max_request_bytes=cfg.max_request_bytes,
        journal_path=run / JOURNAL_FILE,
        digest=digest,
        feed=feed,
        queue=queue if cfg.train else None,
        streamed=streamed,
    )
    if cfg.train:
        gateway.start_expiry(cfg.reward_timeout_s, run / STATS_FILE)
    url = gateway.start(cfg.host, cfg.port)
    (run / "gateway.json").write_text(json.dumps({"url": url, "replica": replica, "trajectories": str(run / TRAJECTORIES_FILE)}))
    log.info("gateway: OpenAI-compatible API of rollout.%d at %s/v1", replica, url)
    return gateway
