"""Gateway: the OpenAI-compatible HTTP server of a rollout replica (starlette + uvicorn,
in a thread of the replica's process). docs/gateway.md.

Routes:
    GET  /v1/models
    POST /v1/chat/completions              generate one reply; record it in the session
    GET  /v1/asyncflow/sessions            ids of the sessions kept
    GET  /v1/asyncflow/sessions/{id}       the session's trajectory (token ids, log-probs, mask, versions)
    POST /v1/asyncflow/sessions/{id}/reward  {"reward": r[, "group": key]}: finish it; appended to the
                                           trajectories file and, with [rollout.gateway] train, written to the queue
    POST /v1/asyncflow/internal/adopt      (the front only) take over sessions of a replica that did not come back

Invariants:
- Every generate call holds ``engine_lock``, which the replica also holds around its
  own generate calls and weight swaps: a reply is produced by one set of weights,
  the version it is recorded with. Requests of different sessions that wait at the
  same time share one generate call (``batcher.py``). With partial rollout
  (``streamed``) the requests join the replica's generation stream instead, weights
  swap between two of its decode steps, and each reply token is recorded with the
  version that sampled it (``batcher.StreamedRequests``).
- With a secret, every route asks for ``Authorization: Bearer <secret>`` (compared in
  constant time) before reading the body.
- A refused request gets a 4xx with an OpenAI-style error body; an unexpected error in
  a request gets a 500 and a log line, and the server goes on.
- With a journal (``journal.py``) every turn and reward is journaled before it is
  answered, and a gateway started on the same journal (the replica restarted) serves
  the sessions as they were; a request whose answer was lost (sent again) gets the
  recorded answer again, never a second reply.
- A request is bounded by the model's context (``context_tokens``) twice: before its new
  messages are rendered or tokenised, text longer than the room left times the longest
  token of the vocabulary is refused (413: it surely does not fit, and a body near
  ``max_request_bytes`` is never tokenised whole); once tokenised, a conversation whose
  tokens and ``max_tokens`` pass the context is refused (400) before the engine sees it.
- With a feed (``[rollout.gateway] train``) a reward is answered 200 once its session
  is in the queue (or waits for its group); a queue that stays full answers 503 with
  ``Retry-After`` and the session stays open for the same reward again.
- With pacing (``start_pacing``) a new session's first request waits, without a thread,
  until the pacer admits it (``pacing.py``: it would otherwise be too old to train by
  the time it is), at most ``pace_wait_s``, then a 503 with ``Retry-After``; a client
  that goes away gives up its place. A session under way is never held.
- Queue writes wait while a checkpoint saves (``hold_writes``, ``resume.py``); on a resume
  (``covered``) the sessions written after the checkpoint are written again from the
  journal, once each, from a thread of their own (``resume.py``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from asyncflow.engines.base import RolloutEngine
from asyncflow.engines.config import SamplingParams
from asyncflow.gateway.api import decode_request, decode_reward
from asyncflow.gateway.batcher import Batcher, StreamedRequests
from asyncflow.gateway.chat import ChatFormat, TemplateError
from asyncflow.gateway.feed import GROUP_HEADER, Rewarded, SessionFeed, unit_rows, write_unit
from asyncflow.gateway.handover import ADOPT_ROUTE, Handover
from asyncflow.gateway.http import HttpServer
from asyncflow.gateway.journal import Journal, Replayed, Written, replay
from asyncflow.gateway.pacing import Pacer
from asyncflow.gateway.prefix import PrefixLedger
from asyncflow.gateway.resume import WriteHold, to_replay
from asyncflow.gateway.sessions import RequestError, SessionStore, Trajectory, check_session_id

log = logging.getLogger(__name__)

SESSION_HEADER = "x-session-id"


RETRY_AFTER_S = 5
"""The ``Retry-After`` of a 503 (a reward refused while the queue is full, a first request held too long)."""

PACE_POLL_S = 0.05
"""How often a held first request looks whether the pacer admits it (on the event loop, no thread held)."""
REPLAY_ALLOCATE_S = 1.0
"""How long one allocation of a resume's sessions waits for room before it asks again."""


def _error(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": code, "code": code}}, status_code=status, headers=headers)


class Gateway:
    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer,
        params: SamplingParams,
        *,
        engine_lock: threading.Lock,
        model_name: str = "asyncflow-policy",
        secret: bytes | None = None,
        trajectories_path: str | Path | None = None,
        max_sessions: int = 1024,
        max_batch: int = 64,
        max_request_bytes: int = 1 << 20,
        journal_path: str | Path | None = None,
        digest=None,
        feed: SessionFeed | None = None,
        queue=None,
        write_timeout_s: float = 30.0,
        streamed: bool = False,
        replica: int | None = None,
        sessions: SessionStore | None = None,
        context_tokens: int = 0,
        launch: int = 0,
        start_step: int = 0,
        covered: set[str] | None = None,
    ):
        """``params``: the run's sampling (temperature, top-p/k, stop tokens; its
        ``max_new_tokens`` caps a request's ``max_tokens``); ``max_batch``: most
        requests in one generate call; ``max_request_bytes``: the largest request body
        (a larger one is refused with a 413 as it arrives, never held whole).
        ``journal_path``: the journal its sessions are kept in and restored from;
        ``digest``: the weights digest of the engine's version (read under the engine
        lock); ``feed`` and ``queue`` (a TQClient): rewarded sessions go into the
        queue, a write waiting at most ``write_timeout_s`` for room. ``streamed`` (partial
        rollout): the requests join the replica's generation stream (``batcher.StreamedRequests``,
        which the replica feeds) instead of generate calls of their own. ``replica``: the
        index of the rollout replica serving it (named in each reply's ``asyncflow`` field);
        ``sessions``: a session store shared with other gateways of this process (the
        routing benchmark, ``scripts/bench_sticky.py``), else one of its own. ``context_tokens``:
        the model's context (its ``max_position_embeddings``), which bounds every request
        (module docstring); 0: unknown, the engine's own check only. ``launch``: the run's
        launch (0, then one more at each resume), which started from version ``start_step``
        (journaled: turns of versions a resume rolled back are told apart, ``journal.py``);
        ``covered`` (a resume): the sessions the checkpoint's queue accounts for, the replica's
        saved state; the others the journal says were written are written again (``resume.py``)."""
        self.max_request_bytes = max_request_bytes
        self.engine, self.params, self.engine_lock = engine, msgspec.structs.replace(params, n=1, seed=None), engine_lock
        self.chat = ChatFormat(tokenizer)
        self.context_tokens = context_tokens
        self.model_name = model_name
        self.secret = secret or None
        self.sessions = sessions if sessions is not None else SessionStore(max_sessions)
        self.replica = replica
        self.prefix = PrefixLedger(max_sessions)  # prompt tokens this replica already ran for the session (prefix.py)
        self.streamed = streamed
        self.batcher: Batcher | StreamedRequests = (
            StreamedRequests() if streamed else Batcher(engine, engine_lock, max_batch, digest=digest)
        )
        self.trajectories_path = Path(trajectories_path) if trajectories_path else None
        self._write_lock = threading.Lock()
        self.feed, self.queue, self.write_timeout_s = feed, queue, write_timeout_s
        self._feed_lock = threading.Lock()  # the feed's state and the queue writes of its units
        self._hold = WriteHold(self._feed_lock)  # writes wait while a checkpoint saves the queue
        self._written: set[str] = set()  # sessions written to the queue (and not to be written again): a checkpoint's
        self._closed: set[str] = set()  # sessions written to the queue or dropped: finished for good
        self._stopping = threading.Event()
        self.pacer: Pacer | None = None  # start_pacing
        self.pace_wait_s = 0.0
        self._replay: list[tuple[Written, list[Rewarded]]] = []  # units to write again (a resume): the replay thread's
        self._replayed = threading.Event()
        self._num_replayed = self._num_rolled_back = 0
        self.journal: Journal | None = None
        if journal_path is not None:
            self.journal = Journal(journal_path)  # held first: a handover of its sessions is over, or waits (journal.py)
            self.journal.append("launch", n=launch, step=start_step)  # before the replay: earlier launches' turns told apart
            self._restore(Path(journal_path), launch, covered)
        self._replay_thread = threading.Thread(target=self._write_replayed, name="gateway-replay", daemon=True)
        self._replay_thread.start()
        self.app = Starlette(
            routes=[
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/asyncflow/sessions", self._list, methods=["GET"]),
                Route("/v1/asyncflow/sessions/{session}", self._session, methods=["GET"]),
                Route("/v1/asyncflow/sessions/{session}/reward", self._reward, methods=["POST"]),
                Route("/v1/asyncflow/stats", self._stats, methods=["GET"]),
                Route(ADOPT_ROUTE, self._adopt, methods=["POST"]),
            ]
        )
        self._http = HttpServer(self.app, "gateway")
        self.url = ""

    def _restore(self, path: Path, launch: int, covered: set[str] | None) -> None:
        """The sessions of a replica that ran before this one (its journal); on a resume
        (``covered``), the units to write again."""
        state = replay(path)
        self._closed = set(state.closed)
        self._load(state)
        if state.turns or self._closed:
            log.info("gateway: %d sessions restored from %s (%d finished for good)", len(state.turns), path, len(self._closed))
        self._num_rolled_back = len(state.rolled_back)
        if state.rolled_back:
            log.warning(
                "gateway: %d sessions have turns generated by weights the resume rolled back: their tokens count as "
                "older versions (trained within workflow.staleness with the off-policy correction, else discarded "
                "as stale and counted)",
                len(state.rolled_back),
            )
        if covered is not None and self.feed is not None:
            for unit in to_replay(state, covered, launch):
                items = [self._rewarded(s, state.rows[s], r, unit.group) for s, r in zip(unit.sessions, unit.rewards)]
                self._replay.append((unit, items))
        again = {s for unit, _ in self._replay for s in unit.sessions}
        self._written = {s for unit in state.written for s in unit.sessions} - again
        if again:
            log.info("gateway: %d sessions written after the checkpoint are written to the queue again", len(again))

    def adopt(self, handover: Handover) -> list[str]:
        """Take over sessions of a replica that did not come back (the front's handover,
        ``handover.py``): journaled here first, as they were recorded there, then served as
        if this replica had run them; a rewarded one waits for its group here (and completes
        it, written once). Sessions this replica knows already are left alone (a handover
        sent again). Returns the sessions taken."""
        new = {s: turns for s, turns in handover.turns.items() if s not in self._closed and self.sessions.lookup(s) is None}
        closed = [s for s in handover.closed if s not in self._closed and self.sessions.lookup(s) is None]
        if self.journal is not None:
            for session, turns in new.items():
                for ev in turns:
                    self.journal.append("turn", **{k: v for k, v in ev.items() if k != "e"})
                if session in handover.rewards:
                    self.journal.append("reward", **{k: v for k, v in handover.rewards[session].items() if k != "e"})
            if closed:
                self.journal.append("closed", s=closed)
        self._closed.update(closed)
        self._load(Replayed(turns=new, rewards={s: r for s, r in handover.rewards.items() if s in new}), write=True)
        if self.pacer is not None:  # ahead here now (written ones left the count as rows of the queue)
            self.pacer.started(sum(1 for s in new if s not in self._closed))
        log.info("gateway: took over %d sessions of rollout.%s (%d finished)", len(new), handover.source, len(closed))
        return sorted(new)

    def _load(self, state: Replayed, write: bool = False) -> None:
        """Serve the sessions of ``state`` as the store held them (an anonymous one stays
        anonymous, an evicted one is not served, none is refused); a rewarded one waits for
        its group in the feed (``write``: a group it completes is written now, else the
        journal says none can be)."""
        for session, turns in state.turns.items():
            first = turns[0]
            t = _trajectory(session, turns)
            reward = state.rewards.get(session)
            if reward is not None:
                t.reward, t.group = reward["reward"], reward.get("group") or t.group
                if self.feed is not None:  # waits for its group again (a lone one was written or is lost)
                    item = Rewarded(session, {**t.to_json(), "reward": t.reward}, self._digest_of(t), time.time())
                    if write:
                        self._offer_adopted(item, t.group)
                    else:
                        self.feed.offer(item, t.group)
            if session not in state.evicted:
                self.sessions.restore(t, anonymous=bool(first.get("anon")))

    def _rewarded(self, session: str, turns: list[dict[str, Any]], reward: float, group: str | None) -> Rewarded:
        """A written session as the journal recorded it, to be written again."""
        t = _trajectory(session, turns)
        t.reward, t.group = reward, group or t.group
        return Rewarded(session, {**t.to_json(), "reward": reward}, self._digest_of(t), time.time())

    def _write_replayed(self) -> None:
        """Write the units of ``_replay`` into the queue, each once, waiting however long for
        room (rows allocated first, so a full queue journals nothing) and never putting
        while a checkpoint holds the writes (``resume.py``)."""
        from asyncflow.core.tq.errors import QueueFull

        for unit, items in self._replay:
            metas = None
            while metas is None and not self._stopping.is_set():
                try:
                    metas = self.queue.allocate(1, len(items), step=-1, timeout_s=REPLAY_ALLOCATE_S)
                except QueueFull:
                    continue
            if metas is None:
                break
            with self._feed_lock:
                while not self._hold.wait(1.0) and not self._stopping.is_set():
                    pass
                if self._stopping.is_set():
                    break
                if self.journal is not None:
                    self.journal.append("writing", s=unit.sessions, g=unit.group, r=unit.rewards)
                self._hold.started()
            try:
                columns, metas = unit_rows(items, metas)
                self.queue.put([m.index for m in metas], columns, metas)
            except Exception:  # at most once, as any write: they are lost, and said so
                log.exception("gateway: sessions %s, written again, could not be put into the queue", unit.sessions)
            else:
                self._num_replayed += len(unit.sessions)
            finally:
                with self._feed_lock:
                    self._written.update(unit.sessions)
                    self._hold.finished()
        self._replay = []
        self._replayed.set()

    def wait_replayed(self, timeout_s: float) -> int:
        """Wait until the sessions to write again (a resume) are in the queue; how many were."""
        if not self._replayed.wait(timeout_s):
            raise TimeoutError(f"the gateway's sessions to write again were not written within {timeout_s:g} s")
        return self._num_replayed

    def hold_writes(self) -> list[str]:
        """A checkpoint's pause: the write in flight finishes, later ones wait for
        ``release_writes``; returns the sessions written so far (what the queue about to be
        saved accounts for, ``resume.py``)."""
        self._hold.held = True  # first: a write that has the lock may wait for room, the next ones wait for the release
        with self._feed_lock:
            self._hold.hold()  # and waits for a put under way
            return sorted(self._written)

    def release_writes(self) -> None:
        with self._feed_lock:
            self._hold.release()

    def _offer_adopted(self, item: Rewarded, group: str | None) -> None:
        try:
            self._feed(item, group)
        except RequestError as exc:  # the queue stayed full: like a reward refused, but nobody sends it again
            log.warning("gateway: session %s, taken over, could not be written: %s", item.session, exc.message)

    @staticmethod
    def _digest_of(t: Trajectory) -> int:
        return t.digests.get(t.version, 0)

    def start_pacing(self, per_step: float, staleness: int, wait_s: float, share: float = 1.0) -> Pacer:
        """Hold new sessions while they would be too stale to train (``pacing.py``):
        ``per_step`` sessions a step (this replica's share of them), ``staleness`` the
        run's bound, a first request held at most ``wait_s``. Counted as ahead from the
        start: the rows waiting in the queue (``share`` of them) and the sessions
        restored from the journal that are not yet written."""
        from asyncflow.config.names import TASK_TRAIN

        assert self.feed is not None and self.queue is not None, "pacing needs the feed and the queue (train = true)"
        status = self.queue.task_status(TASK_TRAIN)
        ready = status.num_rows - sum(status.num_pending.values()) - status.num_acked
        restored = sum(1 for s in self.sessions.ids() if s not in self._closed)
        self.pacer = Pacer(
            per_step, staleness, self.engine.version, ahead=round(ready * share) + restored,
            discarded=round(status.num_discarded * share),
        )  # fmt: skip
        self._pace_share = share
        self.pace_wait_s = wait_s
        return self.pacer

    def _refresh_discards(self) -> None:
        """The trainer's stale discards so far (this replica's share), for the pacer."""
        from asyncflow.config.names import TASK_TRAIN

        if self.pacer is not None and self.queue is not None:
            self.pacer.discarded(round(self.queue.task_status(TASK_TRAIN).num_discarded * self._pace_share))

    def start_expiry(self, timeout_s: float | None, stats_path: str | Path | None = None) -> None:
        """Drop unrewarded sessions and incomplete groups (``expire``) from a daemon thread,
        every tenth of ``timeout_s`` (at most 5 s), writing the counts to ``stats_path``;
        ``timeout_s`` None: drop nothing, write the counts every second."""
        period = min(timeout_s / 10, 1.0) if timeout_s is not None else 1.0

        def sweep() -> None:
            while not self._stopping.wait(period):
                if timeout_s is not None:
                    self.expire(timeout_s)
                if self.pacer is not None:
                    self._refresh_discards()
                if stats_path is not None:
                    Path(stats_path).write_text(json.dumps(self.counters()))

        threading.Thread(target=sweep, name="gateway-expiry", daemon=True).start()

    def counters(self) -> dict[str, float]:
        """The prefix reuse (``gateway/prompt_tokens``, ``gateway/prefix_reused_*``), the
        prompt tokens the engine's prefix cache served (``gateway/prefix_cached_tokens``,
        the native engine's; engines/prefix_cache.py) and the feed's counts
        (``gateway/sessions_*``), for the replica's metrics."""
        out = self.prefix.as_metrics()
        cache = getattr(self.engine, "prefix", None)
        if cache is not None:
            out["gateway/prefix_cached_tokens"] = float(cache.hit_tokens)
        if self.feed is not None:  # read without the feed lock, which a write holds while the queue is full
            out.update(self.feed.counts.as_metrics())
            out["gateway/sessions_replayed"] = float(self._num_replayed)
            out["gateway/sessions_rolled_back"] = float(self._num_rolled_back)
            out["gateway/writes_held"] = float(self._hold.num_waiting)
        if self.pacer is not None:
            out.update(self.pacer.counts.as_metrics())
        return out

    def expire(self, timeout_s: float, now_s: float | None = None) -> int:
        """Drop the sessions not rewarded within ``timeout_s`` of their last turn and the
        groups not complete within it (counted, journaled); returns how many."""
        now_s = time.time() if now_s is None else now_s
        dropped_t = self.sessions.expire(now_s, timeout_s)
        dropped = [t.session for t in dropped_t]
        with self._feed_lock:
            waiting = self.feed.waiting_groups() if self.feed is not None else {}
            if self.feed is not None:
                self.feed.counts.unrewarded += len(dropped)
                groups = [d.session for d in self.feed.expire(now_s)]
            else:
                groups = []
        expired = {key for key, members in waiting.items() if set(members) & set(groups)}
        if self.pacer is not None:
            self.pacer.dropped(len(dropped) + len(groups))
            for key in {t.group for t in dropped_t} | expired:
                self.pacer.settle(key)
        for session in dropped + groups:
            self._closed.add(session)
            if self.journal is not None:
                self.journal.append("dropped", s=session)
        if dropped or groups:
            log.info("gateway: dropped %d sessions without a reward and %d of incomplete groups", len(dropped), len(groups))
        return len(dropped) + len(groups)

    # -- serving -------------------------------------------------------------------
    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0: a free port) from a daemon thread; returns the base URL."""
        self.url = self._http.start(host, port)
        return self.url

    def close(self) -> None:
        self._stopping.set()
        self._http.stop()
        self.batcher.close()  # queued requests fail (500), so the server's threads can finish
        self._http.join()
        self._replay_thread.join(timeout=self.write_timeout_s + 5)  # a write under way ends, then it stops
        if self.journal is not None:
            self.journal.close()

    # -- routes --------------------------------------------------------------------
    def _authorised(self, request: Request) -> bool:
        if self.secret is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.secret)

    async def _guard(self, request: Request, handler) -> Response:
        if not self._authorised(request):
            return _error(
                401, "missing or wrong api key: send the cluster secret as the api key (Authorization: Bearer)", "unauthorized"
            )
        try:
            return await handler(request)
        except RequestError as exc:
            return _error(exc.status, exc.message, exc.code, exc.headers)
        except ClientDisconnect:  # the client went away mid-upload: nothing was recorded, one line is enough
            log.info("gateway: %s %s: the client disconnected before its request arrived", request.method, request.url.path)
            return _error(400, "the request body did not arrive (the client disconnected)", "client_disconnected")
        except Exception as exc:  # a bug or an engine failure: this request fails, the server goes on
            log.exception("gateway: %s %s failed", request.method, request.url.path)
            return _error(500, f"the gateway failed on this request: {type(exc).__name__}: {exc}", "internal_error")

    async def _body(self, request: Request) -> bytes:
        """The request body, at most ``max_request_bytes``: a larger one is refused by its
        Content-Length before a byte is read, or as soon as the stream passes the limit."""
        limit = self.max_request_bytes
        declared = request.headers.get("content-length")
        too_big = RequestError(
            413,
            f"the request body is over {limit} bytes ([rollout.gateway] max_request_bytes): send a shorter conversation",
            "request_too_large",
        )
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    async def _models(self, request: Request) -> Response:
        async def handle(_: Request) -> JSONResponse:
            model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "asyncflow"}
            return JSONResponse({"object": "list", "data": [model]})

        return await self._guard(request, handle)

    async def _chat(self, request: Request) -> Response:
        async def handle(request: Request) -> Response:
            req = decode_request(await self._body(request))
            named = request.headers.get(SESSION_HEADER) or req.user
            session = check_session_id(named) if named else f"anon-{uuid.uuid4().hex}"
            group = request.headers.get(GROUP_HEADER)
            admitted = await self._paced(request, session, group)
            try:
                body = await run_in_threadpool(self.complete, session, req, not named, group, admitted)
            except BaseException:
                if admitted and self.pacer is not None and self.sessions.lookup(session) is None:
                    self.pacer.release()  # it did not start
                raise
            if req.stream:  # server-sent events: the whole reply in one chunk, then the finish
                return StreamingResponse(
                    iter(sse_events(body)), media_type="text/event-stream", headers={"X-Session-Id": session}
                )
            return JSONResponse(body, headers={"X-Session-Id": session})

        return await self._guard(request, handle)

    async def _paced(self, request: Request, session: str, group: str | None) -> bool:
        """Hold a new session's first request until the pacer admits it (True; a session of
        ``group``, the whole group); False for a session under way (or no pacing). Waits on
        the event loop, holding no thread: the requests of sessions under way and the
        rewards go on meanwhile."""
        pacer = self.pacer
        if pacer is None or self.sessions.lookup(session) is not None or session in self._closed:
            return False
        assert self.feed is not None  # start_pacing checked
        ticket = pacer.ticket()
        deadline = time.monotonic() + self.pace_wait_s
        try:
            while not pacer.admit(ticket, self.engine.version, group, self.feed.group_size):
                if self._stopping.is_set():
                    raise RequestError(503, "the gateway is stopping (the run ends)", "stopping")
                if time.monotonic() > deadline:
                    pacer.cancel(ticket, refused=True)
                    raise RequestError(
                        503,
                        f"training is behind: a new session now would be older than workflow.staleness = "
                        f"{pacer.staleness} by the time it is trained; held {self.pace_wait_s:g} s "
                        f"(rollout.gateway.pace_wait_s): send this request again after Retry-After",
                        "paced",
                        headers={"Retry-After": str(RETRY_AFTER_S)},
                    )
                if await request.is_disconnected():  # nobody to answer: its place goes to the next one
                    raise RequestError(400, "the client went away while its first request was held", "client_disconnected")
                await asyncio.sleep(PACE_POLL_S)
        except BaseException:
            pacer.cancel(ticket)
            raise
        return True

    async def _list(self, request: Request) -> Response:
        async def handle(_: Request) -> JSONResponse:
            return JSONResponse({"sessions": self.sessions.ids()})

        return await self._guard(request, handle)

    def _known(self, session: str) -> Trajectory:
        """The kept session ``session``; a 409 for one finished for good (written to the
        queue, or dropped), a 404 for one never seen."""
        if session in self._closed and self.sessions.lookup(session) is None:
            raise RequestError(
                409, f"session {session!r} is finished (trained on, or dropped): use a new session id", "session_finished"
            )
        return self.sessions.get(session)

    async def _session(self, request: Request) -> Response:
        async def handle(request: Request) -> JSONResponse:
            t = self._known(request.path_params["session"])
            with t.lock:
                return JSONResponse(t.to_json())

        return await self._guard(request, handle)

    async def _stats(self, request: Request) -> Response:
        async def handle(_: Request) -> JSONResponse:
            return JSONResponse({"replica": self.replica, "counters": self.counters()})

        return await self._guard(request, handle)

    async def _adopt(self, request: Request) -> Response:
        async def handle(request: Request) -> JSONResponse:  # from the front, not a client: no body limit
            handover = msgspec.json.decode(await request.body(), type=Handover)
            return JSONResponse({"adopted": await run_in_threadpool(self.adopt, handover)})

        return await self._guard(request, handle)

    async def _reward(self, request: Request) -> Response:
        async def handle(request: Request) -> JSONResponse:
            given = decode_reward(await self._body(request))
            if not math.isfinite(given.reward):
                raise RequestError(400, f"reward = {given.reward}: give a finite number")
            t = self._known(request.path_params["session"])
            row = await run_in_threadpool(self.finish, t, given.reward, given.group)
            return JSONResponse(row)

        return await self._guard(request, handle)

    # -- work (in starlette's thread pool) -----------------------------------------------
    def complete(
        self, session: str, req, anonymous: bool = False, group: str | None = None, admitted: bool = False
    ) -> dict[str, Any]:
        """Generate the reply to ``req`` in ``session`` and record it; the OpenAI response body.
        ``anonymous``: the request named no session (the gateway made ``session`` up);
        ``group``: its group key (``X-Group-Id``); ``admitted``: the pacer admitted it as a
        new session (given back if another request started the session meanwhile)."""
        messages = [m.plain(i) for i, m in enumerate(req.messages)]
        if messages[-1]["role"] == "assistant":
            raise RequestError(400, "the last message is an assistant message: the gateway generates the assistant's turn")
        limit = min(x for x in (req.max_completion_tokens, req.max_tokens, self.params.max_new_tokens) if x is not None)
        params = msgspec.structs.replace(self.params, max_new_tokens=limit)
        t = self.sessions.lookup(session)
        if admitted and t is not None and self.pacer is not None:
            self.pacer.release()  # two first requests of one session at once: the other one started it
        if t is None and session in self._closed:
            self._known(session)  # 409: finished for good
        if t is None:
            self._check_size(messages, 0, limit)
            evicted = self.sessions.reserve(session, anonymous)
            if evicted and self.journal is not None:  # a restarted replica serves what the store holds
                self.journal.append("evicted", s=evicted)
            try:
                t = Trajectory(session=session, prompt_ids=self._encode(lambda: self.chat.prompt(messages)), group=group)
                with t.lock:
                    body = self._turn(t, messages, [], params, req)
            except BaseException:
                self.sessions.release(session)
                raise
            self.sessions.add(t)
            return body
        with t.lock:
            if t.finished:
                raise RequestError(
                    409, f"session {session!r} is finished (it has a reward): use a new session id", "session_finished"
                )
            if t.is_retry(messages):  # its answer was lost (the client or the replica went away): the same one again
                return self._body_of(t, req)
            t.group = group or t.group
            new = t.new_messages(messages)
            self._check_size(new, len(t.context_ids()), limit)
            context = self._encode(lambda: self.chat.continuation(t.messages, t.last_reply_ids, new))
            return self._turn(t, messages, context, params, req)

    def _context_error(self, status: int, what: str, max_tokens: int) -> RequestError:
        return RequestError(
            status,
            f"{what} and a reply of max_tokens = {max_tokens} (at most [rollout.gateway] max_new_tokens) pass the model's "
            f"context of {self.context_tokens} tokens (its max_position_embeddings): send a shorter conversation (cut long "
            "tool results), ask for fewer max_tokens, or start a new session",
            "context_length_exceeded",
        )

    def _check_size(self, new: list[dict[str, str]], held: int, max_tokens: int) -> None:
        """Refuse ``new`` messages (after ``held`` tokens of the session) whose text surely
        passes the context: more characters than the room left times the most characters
        one token spells. Cheap: nothing is rendered or tokenised."""
        if not self.context_tokens:
            return
        chars = sum(len(m["content"]) for m in new)
        room = self.context_tokens - held - max_tokens
        if chars > max(room, 0) * self.chat.token_chars:
            what = f"the new messages are {chars} characters (at least {-(-chars // self.chat.token_chars)} tokens)"
            if held:
                what += f" after the {held} tokens the session holds"
            raise self._context_error(413, what, max_tokens)

    @staticmethod
    def _encode(fn) -> list[int]:
        try:
            return fn()
        except TemplateError as exc:
            raise RequestError(400, str(exc)) from None

    def _turn(self, t: Trajectory, messages, context: list[int], params: SamplingParams, req) -> dict[str, Any]:
        ids = t.context_ids() + context
        if self.context_tokens and len(ids) + params.max_new_tokens > self.context_tokens:
            raise self._context_error(400, f"the conversation is {len(ids)} tokens", params.max_new_tokens)
        try:
            c, version = self.batcher.generate(ids, params)  # with other sessions' requests, under the engine lock
        except ValueError as exc:  # too long for the model or its KV cache
            raise RequestError(400, f"the conversation cannot be continued: {exc}") from None
        if c.version != version:
            raise RuntimeError(f"the engine's version changed during a gateway generate call (v{version} -> v{c.version})")
        reply_ids, logprobs, finish = list(c.response_ids), list(c.logprobs), str(c.finish_reason)
        text = self.chat.decode(reply_ids)
        if req.stops:
            reply_ids, logprobs, text, finish = self._cut_at_stop(reply_ids, logprobs, text, finish, req.stops)
        digest = self.batcher.digests.get(c.version, 0)
        # partial rollout: each token's own version (a reply may span a swap), and each version's digest
        tv = list(c.token_versions[: len(reply_ids)]) if self.streamed and c.token_versions is not None else None
        ds = {v: self.batcher.digests.get(v, 0) for v in sorted(set(tv))} if tv is not None else None
        first = t.num_turns == 0
        self.prefix.turn(t.session, ids, c.version)
        self.prefix.ran(t.session, ids, list(c.response_ids), c.version)
        t.add_turn(messages, context, reply_ids, logprobs, text, finish, c.version, digest, reply_versions=tv, digests=ds)
        t.last_turn.update(ids=reply_ids, prompt_tokens=len(ids))
        if self.journal is not None:  # before the answer: the turn survives the replica (journal.py)
            extra: dict[str, Any] = {"prompt_ids": t.prompt_ids} if first else {}
            if first and self.sessions.is_anonymous(t.session):
                extra["anon"] = True
            self.journal.append(
                "turn", s=t.session, request=messages, context=context, reply=reply_ids, logp=[float(x) for x in logprobs],
                text=text, finish=finish, v=c.version, d=digest, group=t.group, **extra,
                **({"tv": tv, "ds": ds} if tv is not None else {}),
            )  # fmt: skip
        return self._body_of(t, req)

    def _body_of(self, t: Trajectory, req) -> dict[str, Any]:
        """The OpenAI response body of ``t``'s last reply."""
        last = t.last_turn
        reply_ids, logprobs = list(t.last_reply_ids), last["logp"]
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": last["text"]},
            "finish_reason": last["finish"],
            "logprobs": None,
        }
        if req.logprobs:
            tok = self.chat.tokenizer
            choice["logprobs"] = {
                "content": [
                    {"token": tok.decode([i]), "logprob": float(lp), "bytes": list(tok.decode([i]).encode()), "top_logprobs": []}
                    for i, lp in zip(reply_ids, logprobs)
                ]
            }
        n_prompt = last.get("prompt_tokens", len(t.context_ids()) - len(reply_ids))
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": n_prompt,
                "completion_tokens": len(reply_ids),
                "total_tokens": n_prompt + len(reply_ids),
            },
            "asyncflow": {
                "session": t.session,
                "turn": t.num_turns,
                "version": last["version"],
                "token_ids": reply_ids,
                "replica": self.replica,
            },
        }

    def _cut_at_stop(
        self, ids: list[int], logprobs: list[float], text: str, finish: str, stops: list[str]
    ) -> tuple[list[int], list[float], str, str]:
        """The reply up to the token that completes the first stop sequence (kept and
        recorded: the model wrote it), its text without the sequence, finish "stop"; as it
        was when no sequence occurs. The tokens after it were generated and are dropped:
        each recorded log-prob is the model's given the tokens before it only. A longer
        prefix's text extends a shorter one's, so the first such token is found by
        bisection: log2(len) decodes, not one per token."""

        def cut(k: int) -> int:  # where the first stop sequence starts in the text of ids[:k]; -1: none
            part = self.chat.decode(ids[:k])
            return min((part.find(s) for s in stops if s in part), default=-1)

        if cut(len(ids)) < 0:
            return ids, logprobs, text, finish
        lo, hi = 1, len(ids)  # the shortest prefix holding a sequence lies in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if cut(mid) >= 0 else (mid + 1, hi)
        return ids[:lo], logprobs[:lo], self.chat.decode(ids[:lo])[: cut(lo)], "stop"

    def finish(self, t: Trajectory, reward: float, group: str | None = None) -> dict[str, Any]:
        """Give the session its reward: appended to the trajectories file, and with a feed
        written to the queue (alone, or with its group once the group is complete)."""
        with t.lock:
            if t.finished:
                raise RequestError(409, f"session {t.session!r} already has a reward ({t.reward})", "session_finished")
            t.group = group or t.group
            row = {**t.to_json(), "reward": reward}
            if self.feed is not None:
                row["queue"] = self._feed(Rewarded(t.session, row, self._digest_of(t), time.time()), t.group)
            if self.journal is not None:
                self.journal.append("reward", s=t.session, reward=reward, group=t.group)
            if self.trajectories_path is not None:  # written before the session counts as finished
                with self._write_lock:
                    append_line(self.trajectories_path, json.dumps(row))
            t.reward = reward
        return row

    def _feed(self, item: Rewarded, group: str | None) -> dict[str, Any]:
        """Offer a rewarded session to the feed and write the unit it completes; what
        became of it (``{"written": [row indices], "sessions": [...]}`` or
        ``{"waiting": n}`` more sessions of its group). A queue that stays full: 503."""
        from asyncflow.core.tq.errors import QueueFull

        with self._feed_lock:
            assert self.feed is not None  # the caller checked
            if not self._hold.wait(self.write_timeout_s):
                raise RequestError(
                    503,
                    "a checkpoint is being saved and holds the queue's writes: send this reward again in a few seconds",
                    "checkpoint_in_progress",
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                )
            unit = self.feed.offer(item, group)
            if not unit:
                return {"group": group, "waiting": self.feed.group_size - len(self.feed.waiting_groups().get(group or "", []))}
            sessions = [u.session for u in unit]
            if self.journal is not None:  # with what a resume needs to write them again (resume.py)
                self.journal.append("writing", s=sessions, g=group, r=[u.row["reward"] for u in unit])
            try:
                indices = write_unit(self.queue, unit, self.write_timeout_s)
            except QueueFull as exc:
                self.feed.restore(unit, group)
                if self.journal is not None:
                    self.journal.append("unwritten", s=sessions)
                raise RequestError(
                    503,
                    f"the training queue is full (the trainer is behind): send this reward again in a few seconds ({exc})",
                    "queue_full",
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                ) from None
            self.feed.written(unit)
            self._written.update(sessions)
            self._closed.update(sessions)
            if self.pacer is not None:  # the group's places that no session took are free again
                self.pacer.settle(group)
        return {"group": group, "written": indices, "sessions": sessions}


def _trajectory(session: str, turns: list[dict[str, Any]]) -> Trajectory:
    """A session as its journaled turns recorded it."""
    first = turns[0]
    t = Trajectory(session=session, prompt_ids=first["prompt_ids"], group=first.get("group"))
    for ev in turns:
        t.add_turn(
            ev["request"], ev["context"], ev["reply"], ev["logp"], ev["text"], ev["finish"], ev["v"], ev["d"],
            reply_versions=ev.get("tv"), digests=ev.get("ds"),
        )  # fmt: skip
        t.group = ev.get("group") or t.group
    return t


def append_line(path: Path, line: str) -> None:
    """Append ``line`` to ``path`` in one write to a file opened for appending: the
    gateways of several replicas append to one trajectories file, and their lines never
    interleave (Linux appends one write at once to a local file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        data = (line + "\n").encode()
        if os.write(fd, data) != len(data):
            raise OSError(f"{path}: a short append ({len(data)} bytes)")
    finally:
        os.close(fd)


def sse_events(body: dict[str, Any]) -> list[bytes]:
    """A chat completion as OpenAI's stream: a ``chat.completion.chunk`` with the whole
    message as its delta, one with the finish reason, usage and asyncflow's fields, then
    ``[DONE]``."""
    choice = body["choices"][0]
    head = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    first = {**head, "choices": [{"index": 0, "delta": choice["message"], "logprobs": choice["logprobs"], "finish_reason": None}]}
    last = {
        **head,
        "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}],
        "usage": body["usage"],
        "asyncflow": body["asyncflow"],
    }
    return [f"data: {json.dumps(chunk)}\n\n".encode() for chunk in (first, last)] + [b"data: [DONE]\n\n"]
