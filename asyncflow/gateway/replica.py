"""Start the gateway in the rollout replica that ``[rollout.gateway] replica`` names, or
in every replica with ``all_replicas``.

The replica calls ``serve_for_replica`` once it has its engine; the HTTP libraries
(the ``gateway`` extra) are imported only when the gateway is on. The URL goes to the
log and to ``RUN_DIR/gateway.json`` (``{"url": ..., "replica": ..., "trajectories": ...}``).
With ``all_replicas`` each replica serves on a free port of its own and keeps its files
in ``RUN_DIR/gateway/replica-<i>/`` (``url.json``, ``journal.jsonl``, ``stats.json``); the
driver's front (``front.py``) writes ``RUN_DIR/gateway.json`` with its one URL.
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
"""RUN_DIR/gateway/stats.json: the feed's counts (``gateway/sessions_*``) and the prefix reuse
(``gateway/prefix_reused_*``), rewritten as they change."""


def replica_dir(run_dir: str | Path, replica: int) -> Path:
    """Where the gateway of replica ``replica`` keeps its files with ``all_replicas``."""
    return Path(run_dir) / "gateway" / f"replica-{replica}"


def replica_url(run_dir: str | Path, replica: int) -> str | None:
    """The URL the gateway of replica ``replica`` serves on now (``all_replicas``), None before it serves."""
    try:
        return json.loads((replica_dir(run_dir, replica) / "url.json").read_text())["url"]
    except (OSError, ValueError, KeyError):
        return None


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
    context_tokens: int = 0,
    per_step: int = 0,
    staleness: int = 0,
    num_replicas: int = 1,
    launch=None,
    saved: bytes = b"",
):
    """The started Gateway when ``cfg`` (a GatewayConfig) puts it on this replica, else None.
    Its sessions are journaled in RUN_DIR (a restarted replica serves them again);
    ``digest``: the engine's weights digest (read under ``engine_lock``); with
    ``cfg.train``, ``queue`` (a TQClient) is where rewarded sessions go, in groups of
    ``group_size`` by key; ``streamed`` (partial rollout): its requests join the replica's
    generation stream (``batcher.StreamedRequests``); ``context_tokens``: the model's
    context, which bounds every request (0: unknown). With ``cfg.train`` and ``cfg.pace``, new
    sessions are paced (``pacing.py``) to ``per_step`` sessions a step (this replica's share of
    ``num_replicas`` with ``all_replicas``) and the run's ``staleness``. ``launch``: the run's LaunchInfo
    (its number and start step; a resume's checkpoint), ``saved``: the replica's state in
    that checkpoint (``resume.py``): a resume writes again the sessions it does not cover."""
    if not cfg.enabled or (replica != cfg.replica and not cfg.all_replicas):
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
    own = replica_dir(run, replica) if cfg.all_replicas else run / "gateway"
    feed = None
    covered = None
    if cfg.train:
        from asyncflow.gateway.feed import SessionFeed
        from asyncflow.gateway.resume import decode_state

        feed = SessionFeed(group_size, cfg.reward_timeout_s)
        covered = decode_state(saved)
        if launch is not None and launch.resume_from and covered is None:
            log.warning(
                "gateway: the checkpoint %s does not say which sessions its queue holds (saved before gateway "
                "replicas kept it): sessions written after it are not written again",
                launch.resume_from,
            )
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
        journal_path=own / Path(JOURNAL_FILE).name,
        digest=digest,
        feed=feed,
        queue=queue if cfg.train else None,
        streamed=streamed,
        replica=replica,
        context_tokens=context_tokens,
        launch=launch.launch if launch is not None else 0,
        start_step=launch.start_step if launch is not None else 0,
        covered=covered,
    )
    if cfg.train and cfg.pace:
        share = 1 / num_replicas if cfg.all_replicas else 1.0
        gateway.start_pacing(per_step * share, staleness, cfg.pace_wait_s, share=share)
    gateway.start_expiry(cfg.reward_timeout_s if cfg.train else None, own / Path(STATS_FILE).name)
    url = gateway.start(cfg.host, 0 if cfg.all_replicas else cfg.port)
    if cfg.all_replicas:  # the front (driver) routes to it: read again by the front when it restarts
        (own / "url.json.tmp").write_text(json.dumps({"url": url}))
        (own / "url.json.tmp").replace(own / "url.json")  # the front never reads half a file
    else:
        (run / "gateway.json").write_text(
            json.dumps({"url": url, "replica": replica, "trajectories": str(run / TRAJECTORIES_FILE)})
        )
    log.info("gateway: OpenAI-compatible API of rollout.%d at %s/v1", replica, url)
    return gateway
