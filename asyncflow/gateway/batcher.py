"""Batcher: the gateway's requests that wait for the engine at the same time go to it
in one generate call (the engine batches them continuously), instead of one call each.

Requests are queued; one thread takes every queued request with the same sampling
parameters (they differ only in ``max_new_tokens``) and generates them together under
the replica's engine lock. A call refused for one prompt (too long for the model or
the KV cache: ``ValueError``) is retried prompt by prompt, so one bad request fails
alone.

Invariants:
- every request gets exactly one result: its completion and the version it was
  generated with, or the error of its generate call (``close`` fails the queued ones);
- a completion belongs to the prompt it answers (the engine orders completions by
  ``prompt_index``; each is checked against the batch position).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from asyncflow.engines.base import Completion, RolloutEngine
from asyncflow.engines.config import SamplingParams
from asyncflow.gateway.sessions import RequestError

log = logging.getLogger(__name__)


@dataclass
class _Request:
    ids: list[int]
    params: SamplingParams
    result: Future = field(default_factory=Future)


class _RequestQueue:
    """The queue both kinds of serving share: requests in arrival order, refused with a 503
    once closed; ``num_requests`` counts those queued so far (tests wait on it under ``_cv``)."""

    def __init__(self) -> None:
        self._queue: list[_Request] = []
        self._cv = threading.Condition()
        self._closed = False
        self.num_requests = 0

    def _enqueue(self, ids: list[int], params: SamplingParams) -> _Request:
        request = _Request(list(ids), params)
        with self._cv:
            if self._closed:
                raise RequestError(503, "the gateway is stopping (its replica or the run ends)", "gateway_stopping")
            self._queue.append(request)
            self.num_requests += 1
            self._cv.notify_all()
        return request


class Batcher(_RequestQueue):
    def __init__(
        self, engine: RolloutEngine, engine_lock: threading.Lock, max_batch: int = 64, digest: Callable[[], int] | None = None
    ):
        """``digest``: the weights digest of the engine's version, read under the engine lock
        with each generate call (``digests``)."""
        self.engine, self.engine_lock, self.max_batch = engine, engine_lock, max_batch
        self.digest = digest
        self.digests: dict[int, int] = {}
        """version -> the weights digest its generate calls ran with."""
        super().__init__()
        self._thread = threading.Thread(target=self._loop, name="gateway-generate", daemon=True)
        self._thread.start()

    def generate(self, ids: list[int], params: SamplingParams) -> tuple[Completion, int]:
        """One completion of ``ids`` and the policy version that generated it (blocks)."""
        return self._enqueue(ids, params).result.result()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            queued, self._queue = self._queue, []
            self._cv.notify_all()
        for r in queued:
            r.result.set_exception(
                RequestError(
                    503, "the gateway stopped before generating this reply (its replica or the run ends)", "gateway_stopping"
                )
            )
        self._thread.join(timeout=10)

    def _take(self) -> list[_Request] | None:
        with self._cv:
            while not self._queue and not self._closed:
                self._cv.wait()
            if self._closed:
                return None
            params = self._queue[0].params
            batch = [r for r in self._queue if r.params == params][: self.max_batch]
            taken = {id(r) for r in batch}
            self._queue = [r for r in self._queue if id(r) not in taken]
            self._cv.notify_all()  # a waiter on the queue's state (tests) sees the take at once
            return batch

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            try:
                self._run(batch)
            except BaseException as exc:  # noqa: BLE001  (handed to the requests; the loop goes on)
                for r in batch:
                    if not r.result.done():
                        r.result.set_exception(exc)

    def _run(self, batch: list[_Request]) -> None:
        try:
            results = self._generate(batch)
        except ValueError:
            if len(batch) == 1:
                raise
            for r in batch:  # one prompt was refused: each on its own, so it fails alone
                try:
                    r.result.set_result(self._generate([r])[0])
                except Exception as exc:
                    r.result.set_exception(exc)
            return
        for r, result in zip(batch, results):
            r.result.set_result(result)

    def _generate(self, batch: list[_Request]) -> list[tuple[Completion, int]]:
        with self.engine_lock:  # the replica swaps weights and generates under it too
            version = self.engine.version
            if self.digest is not None:
                self.digests[version] = self.digest()
            completions = self.engine.generate([r.ids for r in batch], batch[0].params)
        if [c.prompt_index for c in completions] != list(range(len(batch))):
            raise RuntimeError(f"the engine answered prompts {[c.prompt_index for c in completions]} of {len(batch)}")
        return [(c, version) for c in completions]


class StreamedRequests(_RequestQueue):
    """With partial rollout (``[workflow] partial_rollout``): the gateway's requests join
    the replica's generation stream (``actors/rollout/stream.py`` takes them between two
    decode steps) instead of generate calls of their own, so weights swap between any
    two decode steps of a reply too and each reply token records the version that
    sampled it (``Completion.token_versions``). The same surface as ``Batcher`` for the
    server (``generate``, ``digests``, ``close``), and ``take``/``abandon`` for the
    replica.

    Invariants: every request gets exactly one result: its completion and the version of
    its first token, or an error (``abandon``, ``close``); ``digests`` holds the digest of
    every version the stream swapped in (the replica records each, ``record``)."""

    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[int, int] = {}
        """version -> the weights digest of that version (recorded by the replica)."""
        self.arrived = threading.Event()
        """Set when a request is queued: wakes the replica's idle wait."""

    def generate(self, ids: list[int], params: SamplingParams) -> tuple[Completion, int]:
        """One completion of ``ids`` and its first token's version (blocks until the stream gives it)."""
        request = self._enqueue(ids, params)
        self.arrived.set()
        completion = request.result.result()
        return completion, completion.version

    def record(self, version: int, digest: int) -> None:
        """The digest of a version the replica swapped in."""
        self.digests.setdefault(version, digest)

    def take(self) -> list[_Request]:
        """The requests queued since the last take (the replica adds them to its stream)."""
        with self._cv:
            self.arrived.clear()
            taken, self._queue = self._queue, []
        return taken

    @staticmethod
    def deliver(request: _Request, completion: Completion) -> None:
        """The stream finished ``request``'s reply."""
        request.result.set_result(completion)

    def abandon(self, requests: list[_Request], why: str) -> None:
        """Fail requests the stream will not finish (it closes: the replica or the run stops)."""
        for r in requests:
            if not r.result.done():
                r.result.set_exception(
                    RequestError(503, f"the gateway stopped before this reply was done: {why}", "gateway_stopping")
                )

    def close(self) -> None:
        with self._cv:
            self._closed = True
            queued, self._queue = self._queue, []
        self.abandon(queued, "its replica or the run ends")
