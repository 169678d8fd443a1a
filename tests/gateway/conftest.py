"""Fixtures: a gateway on a free loopback port, over tests/conftest.py's tiny model (``tiny_dir``, ``tokenizer``)."""

import threading

import pytest
import torch

torch.set_num_threads(1)


class SpyEngine:
    """A real rollout engine that also records the prompts each generate call got."""

    def __init__(self, engine, lock):
        self.inner, self.lock, self.prompts, self.locked = engine, lock, [], []

    def generate(self, prompts, params):
        self.prompts.append([list(p) for p in prompts])
        self.locked.append(self.lock.locked())  # the replica's engine lock, held by the caller?
        return self.inner.generate(prompts, params)

    @property
    def version(self):
        return self.inner.version

    @property
    def prefix(self):
        return self.inner.prefix


@pytest.fixture
def make_gateway(tiny_dir, tokenizer, tmp_path):
    from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
    from asyncflow.engines.factory import build_rollout_engine
    from asyncflow.gateway.server import Gateway

    started = []

    def make(tokenizer=tokenizer, version: int = 0, **kw):
        """``version``: the policy version the engine's weights are."""
        lock = threading.Lock()
        cfg = RolloutEngineConfig(max_batch_size=4, kv_cache_bytes=1 << 20)
        engine = SpyEngine(build_rollout_engine(cfg, tiny_dir, version=version), lock)
        params = SamplingParams(max_new_tokens=16, stop_token_ids=(tokenizer.eos_token_id,))
        kw.setdefault("trajectories_path", tmp_path / "trajectories.jsonl")
        gw = Gateway(engine, tokenizer, params, engine_lock=lock, **kw)
        gw.start("127.0.0.1", 0)
        started.append(gw)
        return gw

    yield make
    for gw in started:
        gw.close()


@pytest.fixture
def front_of():
    """``front_of(gateways, **kw)``: a Front before these gateways (index -> Gateway), on 127.0.0.1."""
    from asyncflow.gateway.front import Front

    started = []

    def make(gateways: dict, **kw):
        front = Front(sorted(gateways), lambda i: gateways[i].url if i in gateways else None, **kw)
        front.start("127.0.0.1", 0)
        started.append(front)
        return front

    yield make
    for front in started:
        front.close()
