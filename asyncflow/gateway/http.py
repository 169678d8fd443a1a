"""Serve a starlette app with uvicorn from a daemon thread: the gateway of a replica
(``server.py``) and the front that routes to several (``front.py``)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0


class HttpServer:
    def __init__(self, app: Any, what: str):
        self.app, self.what = app, what
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self, host: str, port: int, key: str = "[rollout.gateway] port") -> str:
        """Serve on ``host:port`` (0: a free port); returns the base URL. ``key``: the
        setting a busy port is fixed with."""
        import uvicorn

        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            sock.close()
            raise RuntimeError(
                f"the {self.what} cannot listen on {host}:{port} ({exc}): set {key} to a free port, or 0"
            ) from None
        bound = sock.getsockname()
        server = uvicorn.Server(uvicorn.Config(self.app, log_config=None, log_level="warning", access_log=False, lifespan="off"))
        failed: list[BaseException] = []

        def serve() -> None:
            try:
                server.run(sockets=[sock])
            except BaseException as exc:  # noqa: BLE001  (reported to start(), or logged once serving)
                failed.append(exc)
                log.error("the %s's HTTP server stopped: %s", self.what, exc)

        self._server = server
        self._thread = threading.Thread(target=serve, name=f"{self.what}-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if failed or not self._thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise RuntimeError(f"the {self.what}'s HTTP server did not start on {host}:{bound[1]}: {failed or 'timed out'}")
            self._thread.join(timeout=0.01)
        shown = f"[{bound[0]}]" if family == socket.AF_INET6 else bound[0]
        self.url = f"http://{shown}:{bound[1]}"
        return self.url

    def stop(self) -> None:
        """Ask the server to stop (it finishes the requests in progress)."""
        if self._server is not None:
            self._server.should_exit = True

    def join(self, timeout_s: float = 10) -> None:
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            if self._thread.is_alive():
                log.warning("the %s's HTTP server did not stop within %s s (a request still running?)", self.what, timeout_s)
