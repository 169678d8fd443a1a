"""Front: one stable URL before the gateways of several rollout replicas
(``[rollout.gateway] all_replicas``), served from the driver's process. It forwards
each request to the replica its session is routed to (``routes.py``: sticky, so a
session's prefix stays on the replica that ran it, ``prefix.py``) and answers the rest
itself. docs/gateway.md, "Several replicas".

Routes (the gateway's, ``server.py``):
    /v1/chat/completions                     the session's replica (a new session: its group's, else the least loaded)
    /v1/asyncflow/sessions/{id}[/reward]     the session's replica; 404 for a session the front never routed
    /v1/asyncflow/sessions                   the union of the live replicas' lists
    /v1/asyncflow/stats                      each live replica's counters, their sums and the routing counts
    /v1/models                               a live replica

Invariants:
- The front keeps no session state but the routing table: replicas journal their
  sessions, and a replica the Supervisor restarts serves them again from its journal.
- A replica the front cannot reach (its process died, or it restarts) is down: its
  sessions' requests get a 503 with ``Retry-After`` until it writes its new address
  (``locate`` gives another URL), and new sessions go to the live replicas. A request
  whose answer was lost that way can be sent again as it was: the restarted replica
  answers it with the recorded reply, never a second one (``server.py``).
- A replica down for ``move_after_s`` (or out of the ``roster`` and down: removed, it never
  comes back) hands its sessions over: read from its journal once nobody holds it, each
  goes on on a live replica with its recorded state (``handover.py``), once.
- With a ``roster`` (the run's replicas now: the Supervisor's record) new sessions reach a
  replica added mid-run once it serves, and none go to one that is no longer in it.
- Authorization headers are forwarded as they came: each replica checks the secret.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from asyncflow.gateway.handover import ADOPT_ROUTE, take_over
from asyncflow.gateway.http import HttpServer
from asyncflow.gateway.routes import Policy, ReplicaDown, RouteTable

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5
FORWARDED = ("authorization", "content-type", "x-session-id", "x-group-id")
ANSWERED = ("content-type", "x-session-id", "retry-after")


def _error(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": code, "code": code}}, status_code=status, headers=headers)


class _Gone(Exception):
    """The replica did not answer (refused the connection, or died mid-request)."""


class _Slow(Exception):
    """The replica took the request but did not answer within ``request_timeout_s``."""


class Front:
    def __init__(
        self,
        replicas: list[int],
        locate: Callable[[int], str | None],
        *,
        policy: Policy = "sticky",
        max_request_bytes: int = 1 << 20,
        request_timeout_s: float = 600.0,
        journal_of: Callable[[int], Path] | None = None,
        move_after_s: float | None = None,
        roster: Callable[[], list[int]] | None = None,
        secret: bytes | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``locate(i)``: the base URL rollout replica ``i``'s gateway serves on now (None:
        not serving yet). A replica that takes the request but does not answer within
        ``request_timeout_s`` (frozen, or stuck) gets the client a 504; it is not marked
        down, since a slow replica keeps its sessions. ``journal_of(i)``: replica ``i``'s
        journal, whose sessions go to live replicas once it is down for ``move_after_s``
        (None: never; ``clock`` reads the time); ``roster()``: the run's replicas now;
        ``secret``: what the front's own requests to the replicas (handovers) carry."""
        self.table = RouteTable(replicas, policy)
        self.locate = locate
        self.journal_of, self.move_after_s, self.roster, self.clock = journal_of, move_after_s, roster, clock
        self._auth = {"authorization": f"Bearer {secret.decode()}"} if secret else {}
        self._moving = asyncio.Lock()
        self.max_request_bytes = max_request_bytes
        self._failed_url: dict[int, str | None] = {}  # a down replica -> the URL it did not answer on
        self.request_timeout_s = request_timeout_s
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(request_timeout_s, connect=10.0))
        self.app = Starlette(
            routes=[
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/asyncflow/sessions", self._list, methods=["GET"]),
                Route("/v1/asyncflow/sessions/{session}", self._session, methods=["GET"]),
                Route("/v1/asyncflow/sessions/{session}/reward", self._reward, methods=["POST"]),
                Route("/v1/asyncflow/stats", self._stats, methods=["GET"]),
            ]
        )
        self._http = HttpServer(self.app, "gateway front")
        self.url = ""

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self.url = self._http.start(host, port)
        return self.url

    def close(self) -> None:
        self._http.stop()
        self._http.join()
        try:  # its pool's sockets: the server's event loop is gone, so on a loop of its own
            asyncio.run(self._client.aclose())
        except Exception as exc:  # a connection bound to the stopped loop: the sockets close with it
            log.debug("gateway front: closing the client: %r", exc)

    # -- replicas ------------------------------------------------------------------
    async def _refresh(self) -> None:
        """The roster's replicas that serve are routed to; a down replica that serves on a new
        address (restarted) is up again; one down past the grace hands its sessions over."""
        if self.roster is not None:
            known = set(self.table.replicas)
            self.table.set_roster([r for r in self.roster() if r in known or self.locate(r) is not None])
        for replica, failed in list(self._failed_url.items()):
            url = self.locate(replica)
            if url is not None and url != failed:
                del self._failed_url[replica]
                self.table.up(replica)
                log.info("gateway front: rollout.%d is back at %s", replica, url)
        # a request waits for a handover under way: its session may be pinned where it is not yet taken over
        if self.journal_of is not None and (self._moving.locked() or self.table.due(self.clock(), self.move_after_s)):
            async with self._moving:
                for replica in self.table.due(self.clock(), self.move_after_s):
                    await self._hand_over(replica)

    async def _hand_over(self, replica: int) -> None:
        """Give the sessions of ``replica`` (gone) to live replicas, with their recorded state."""
        assert self.journal_of is not None
        try:
            handovers = await asyncio.to_thread(
                take_over, self.journal_of(replica), replica, lambda groups, done: self.table.hand_over(replica, groups, done)
            )
        except ReplicaDown:
            return  # no live replica to take them: they wait
        if handovers is None:
            log.info("gateway front: rollout.%d does not answer but its journal is held: its sessions stay", replica)
            return
        for to, handover in handovers.items():
            url = self.locate(to)
            try:
                if url is None:
                    raise httpx.ConnectError("not serving")
                r = await self._client.post(url + ADOPT_ROUTE, content=msgspec.json.encode(handover), headers=self._auth)
                r.raise_for_status()
            except httpx.HTTPError as exc:  # marked moved already: lost rather than held twice (handover.py)
                log.error(
                    "gateway front: rollout.%d could not take over %d sessions of rollout.%d: %r",
                    to,
                    len(handover.turns),
                    replica,
                    exc,
                )
                continue
            log.warning(
                "gateway front: rollout.%d did not come back: %d sessions go on on rollout.%d", replica, len(handover.turns), to
            )

    def _down(self, replica: int, url: str | None) -> None:
        if not self.table.is_down(replica):
            log.warning("gateway front: rollout.%d does not answer at %s: its sessions wait until it is back", replica, url)
        self._failed_url[replica] = url
        self.table.down(replica, self.clock())

    async def _forward(self, replica: int, request: Request, body: bytes | None) -> httpx.Response:
        url = self.locate(replica)
        if url is None:
            self._down(replica, None)
            raise _Gone()
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED}
        try:
            return await self._client.request(request.method, url + request.url.path, content=body, headers=headers)
        except (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout):
            raise _Slow() from None
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            self._down(replica, url)
            raise _Gone() from None

    @staticmethod
    def _answer(r: httpx.Response) -> Response:
        headers = {k: v for k, v in r.headers.items() if k.lower() in ANSWERED and k.lower() != "content-type"}
        return Response(r.content, status_code=r.status_code, headers=headers, media_type=r.headers.get("content-type"))

    @staticmethod
    def _refused(replica: int | None, session: str | None) -> JSONResponse:
        which = f"rollout.{replica}, which serves session {session!r}," if replica is not None and session else "every replica"
        return _error(
            503,
            f"{which} is down (restarting): send the request again in a few seconds; the session goes on where it was",
            "replica_down",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    def _timed_out(self, replica: int) -> JSONResponse:
        log.warning("gateway front: rollout.%d did not answer within %.0f s", replica, self.request_timeout_s)
        return _error(
            504,
            f"rollout.{replica} took the request but did not answer within {self.request_timeout_s:g} s "
            "([rollout.gateway] request_timeout_s): it may be frozen or overloaded; send the request again, or raise the key",
            "replica_timeout",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    async def _body(self, request: Request) -> bytes | None:
        """The body, or None when it is over ``max_request_bytes`` (by its Content-Length, or
        as soon as the stream passes it): never held whole."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_request_bytes:
            return None
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_request_bytes:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self) -> JSONResponse:
        return _error(
            413,
            f"the request body is over {self.max_request_bytes} bytes ([rollout.gateway] max_request_bytes): "
            "send a shorter conversation",
            "request_too_large",
        )

    # -- routes --------------------------------------------------------------------
    async def _chat(self, request: Request) -> Response:
        body = await self._body(request)
        if body is None:
            return self._too_large()
        session = request.headers.get("x-session-id") or _field(body, "user")
        group = request.headers.get("x-group-id")
        await self._refresh()
        placeholder = session or f"anon-{uuid.uuid4().hex}"  # an anonymous session is named by its replica's answer
        try:
            replica = self.table.route(placeholder, group)
            r = await self._forward(replica, request, body)
        except ReplicaDown as exc:
            return self._refused(exc.replica, session)
        except _Gone:
            if session is None or not await self._moved(session, replica):
                return self._refused(replica, session)
            try:  # handed over at once (its replica left the roster): served where it went
                replica = self.table.route(session, group)
                r = await self._forward(replica, request, body)
            except (ReplicaDown, _Gone):
                return self._refused(replica, session)
            except _Slow:
                return self._timed_out(replica)
        except _Slow:
            return self._timed_out(replica)
        finally:
            if session is None:
                self.table.forget(placeholder)
        named = r.headers.get("x-session-id")
        if session is None and named is not None and r.status_code == 200:
            self.table.pin(named, replica, group)
        return self._answer(r)

    async def _session(self, request: Request) -> Response:
        return await self._to_owner(request, None)

    async def _reward(self, request: Request) -> Response:
        body = await self._body(request)
        if body is None:
            return self._too_large()
        session = request.path_params["session"]
        group = _field(body, "group")
        owner, pinned = self.table.replica_of(session), self.table.group_replica(group) if group else None
        if owner is not None and pinned is not None and pinned != owner:
            return _error(
                409,
                f"session {session!r} is on rollout.{owner} and group {group!r} on rollout.{pinned}: with several replicas "
                "give the group key in the X-Group-Id header of the session's first request, so a group's sessions meet "
                "on one replica",
                "group_split",
            )
        r = await self._to_owner(request, body)
        if r.status_code == 200:
            self.table.finished(session)
            if group and owner is not None:
                self.table.pin(session, owner, group)
        return r

    async def _to_owner(self, request: Request, body: bytes | None) -> Response:
        session = request.path_params["session"]
        if self.table.replica_of(session) is None:
            return _error(404, f"no session {session!r} (not started through this gateway)", "session_not_found")
        await self._refresh()
        replica = self.table.replica_of(session)
        if replica is None or self.table.is_down(replica):
            return self._refused(replica, session)
        try:
            return self._answer(await self._forward(replica, request, body))
        except _Gone:
            if not await self._moved(session, replica):
                return self._refused(replica, session)
        replica = self.table.replica_of(session)  # handed over at once (its replica left the roster)
        if replica is None:
            return _error(404, f"no session {session!r} (its replica is gone and it had no recorded turn)", "session_not_found")
        try:
            return self._answer(await self._forward(replica, request, body))
        except _Gone:
            return self._refused(replica, session)

    async def _moved(self, session: str, replica: int) -> bool:
        """Whether ``session``, whose ``replica`` was just found gone, was handed over at once
        (to another replica; a session with no recorded turn is routed afresh)."""
        await self._refresh()
        return self.table.replica_of(session) != replica

    async def _live(self, request: Request) -> dict[int, Any]:
        """Each live replica's JSON answer to ``request`` (a GET)."""
        await self._refresh()
        out = {}
        for replica in self.table.replicas:
            if self.table.is_down(replica):
                continue
            try:
                r = await self._forward(replica, request, None)
            except _Gone:
                continue
            if r.status_code != 200:
                return {-1: self._answer(r)}  # refused (the secret): the same refusal
            out[replica] = r.json()
        return out

    async def _models(self, request: Request) -> Response:
        answers = await self._live(request)
        if -1 in answers:
            return answers[-1]
        if not answers:
            return self._refused(None, None)
        return JSONResponse(next(iter(answers.values())))

    async def _list(self, request: Request) -> Response:
        answers = await self._live(request)
        if -1 in answers:
            return answers[-1]
        return JSONResponse({"sessions": sorted(s for a in answers.values() for s in a["sessions"])})

    async def _stats(self, request: Request) -> Response:
        answers = await self._live(request)
        if -1 in answers:
            return answers[-1]
        total: dict[str, float] = {}
        for a in answers.values():
            for k, v in a["counters"].items():
                total[k] = total.get(k, 0.0) + v
        per = {str(r): a["counters"] for r, a in answers.items()}
        return JSONResponse({"policy": self.table.policy, "replicas": per, "total": total, "routing": self.table.counts()})


def _field(body: bytes, key: str) -> str | None:
    """A string field of a JSON object body, or None (the replica refuses a bad body itself)."""
    try:
        value = json.loads(body).get(key) if body else None
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def serve_front(
    cfg, run_dir: str | Path, num_replicas: int, roster: Callable[[], list[int]] | None = None, secret: bytes = b""
) -> Front:
    """Start the front of a run's ``num_replicas`` gateways (``cfg``: its GatewayConfig, with
    ``all_replicas``) on ``cfg.host:cfg.port`` and write its URL to ``RUN_DIR/gateway.json``.
    ``roster()``: the run's replica indices now (the Supervisor's record: replicas the online
    planner adds or removes); ``secret``: the cluster secret (the front's handovers carry it)."""
    from asyncflow.gateway.journal import JOURNAL_FILE
    from asyncflow.gateway.replica import TRAJECTORIES_FILE, replica_dir, replica_url

    run = Path(run_dir)
    front = Front(
        list(range(num_replicas)),
        lambda i: replica_url(run, i),
        max_request_bytes=cfg.max_request_bytes,
        request_timeout_s=cfg.request_timeout_s,
        journal_of=lambda i: replica_dir(run, i) / Path(JOURNAL_FILE).name,
        move_after_s=cfg.session_move_after_s,
        roster=roster,
        secret=secret or None,
    )
    url = front.start(cfg.host, cfg.port)
    info = {"url": url, "replica": "all", "replicas": num_replicas, "trajectories": str(run / TRAJECTORIES_FILE)}
    (run / "gateway.json").write_text(json.dumps(info))
    log.info("gateway: OpenAI-compatible API of rollout.0-%d (sticky sessions) at %s/v1", num_replicas - 1, url)
    return front
