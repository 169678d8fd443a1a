"""The gateway with partial rollout (``streamed``): its requests join a generation stream
that a replica drives (``batcher.StreamedRequests``), weights swap between two decode
steps of a reply, and the session records each reply token's version, in its
trajectory and in its journal (a restarted gateway has the same versions). The swap
comes at a decode step the test's replica loop chooses, never after a sleep."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from gateway_helpers import call

from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
from asyncflow.engines.factory import build_rollout_engine
from asyncflow.gateway.server import Gateway

MAX_NEW = 8
SWAP_AFTER_STEPS = 3  # the first step prefills (token 0) and decodes (token 1): tokens 0..3 from v0, 4.. from v1


class Replica:
    """What the rollout's stream mode does for the gateway (actors/rollout/stream.py), in a
    thread: take the requests, add them to the stream, step it, deliver the replies; after
    ``SWAP_AFTER_STEPS`` decode steps of the first reply, load v1 between two steps."""

    def __init__(self, engine, requests):
        self.engine, self.requests = engine, requests
        self.stream = engine.open_stream(SamplingParams(n=1, max_new_tokens=MAX_NEW, stop_token_ids=()))
        self.served: dict = {}
        self.steps = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        self.requests.record(0, 0)
        while not self.stop.is_set():
            for r in self.requests.take():
                (index,) = self.stream.add([r.ids], n=1, max_new_tokens=r.params.max_new_tokens)
                self.served[index] = r
            if not self.served:
                self.requests.arrived.wait(0.05)
                continue
            for c in self.stream.step():
                self.requests.deliver(self.served.pop(c.prompt_index), c)
            self.steps += 1
            if self.steps == SWAP_AFTER_STEPS:
                g = torch.Generator().manual_seed(1)
                noisy = [
                    (n, t.detach() + 0.05 * torch.randn(t.shape, generator=g)) for n, t in self.engine.model.named_parameters()
                ]
                self.engine.load_weights(noisy, version=1)
                self.requests.record(1, 0x11)


@pytest.mark.timeout(120)
def test_a_reply_that_spans_a_swap_records_each_tokens_version_and_its_journal_keeps_them(tiny_dir, tokenizer, tmp_path):
    torch.set_num_threads(1)
    engine = build_rollout_engine(RolloutEngineConfig(max_batch_size=4, kv_cache_bytes=1 << 20), tiny_dir)
    params = SamplingParams(max_new_tokens=MAX_NEW, stop_token_ids=())
    journal = tmp_path / "journal.jsonl"
    gw = Gateway(engine, tokenizer, params, engine_lock=threading.Lock(), journal_path=journal, streamed=True)
    replica = Replica(engine, gw.batcher)
    replica.thread.start()
    try:
        gw.start("127.0.0.1", 0)
        body = {"model": "m", "messages": [{"role": "user", "content": "3+4="}], "user": "s1"}
        status, reply = call(gw.url, "/v1/chat/completions", json.dumps(body).encode())
        assert status == 200, reply
        status, session = call(gw.url, "/v1/asyncflow/sessions/s1")
        assert status == 200, session
    finally:
        replica.stop.set()
        replica.thread.join(timeout=10)
        gw.close()
        replica.stream.close()
    expected = [0] * (SWAP_AFTER_STEPS + 1) + [1] * (MAX_NEW - SWAP_AFTER_STEPS - 1)
    assert session["token_versions"] == expected and session["loss_mask"] == [1] * MAX_NEW
    assert session["version"] == 0 and reply["asyncflow"]["version"] == 0  # the oldest token's
    restored = Gateway(engine, tokenizer, params, engine_lock=threading.Lock(), journal_path=journal, streamed=True)
    try:
        t = restored.sessions.get("s1")
        assert t.token_versions == expected and t.digests == {0: 0, 1: 0x11}
    finally:
        restored.close()


@pytest.mark.timeout(60)
def test_a_streamed_gateways_requests_left_in_the_stream_fail_with_503_when_it_closes(tiny_dir, tokenizer):
    engine = build_rollout_engine(RolloutEngineConfig(max_batch_size=4, kv_cache_bytes=1 << 20), tiny_dir)
    gw = Gateway(engine, tokenizer, SamplingParams(max_new_tokens=MAX_NEW), engine_lock=threading.Lock(), streamed=True)
    gw.start("127.0.0.1", 0)
    results: list = []
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "3+4="}], "user": "s2"}).encode()
    caller = threading.Thread(target=lambda: results.append(call(gw.url, "/v1/chat/completions", body)), daemon=True)
    caller.start()
    while not (taken := gw.batcher.take()):  # the request reached the replica's side
        gw.batcher.arrived.wait(1.0)
    gw.batcher.abandon(taken, "the test's stream closed")
    caller.join(timeout=30)
    gw.close()
    ((status, error),) = results
    assert status == 503 and "the test's stream closed" in error["error"]["message"], error
