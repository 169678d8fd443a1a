"""The trainer's step shapes (actors/trainer/sources/) on a real queue, without a trainer
process: which config asks for which shape, what a shape refuses, what each take hands
the trainer, and that a new shape is one class and one registry line."""

from __future__ import annotations

import contextlib
import types

import numpy as np
import pytest

from asyncflow.actors.runtime.acks import DeferredAcks
from asyncflow.actors.trainer import sources
from asyncflow.actors.trainer.sources import (
    SOURCES,
    Batch,
    StepContext,
    WholeStep,
    check_step_shape,
    source_for,
)
from asyncflow.actors.trainer.sources.dynamic import DynamicSampling
from asyncflow.actors.trainer.sources.sessions import GatewaySessions
from asyncflow.actors.trainer.sources.streamed import StreamedStep
from asyncflow.config.load import ConfigError, load_config_text
from asyncflow.config.names import TASK_TRAIN
from asyncflow.core import protocol
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.launch import spawn_queue
from asyncflow.core.transport import TransportConfig

pytestmark = pytest.mark.timeout(60)

BASE = '[model]\ntiny = "qwen2"\n'
GATEWAY = "[rollout.gateway]\nenabled = true\ntrain = true\nnum_sessions = 64\n"
COLUMNS = ["response_ids", "reward"]


def cfg_of(toml: str = "", **train):
    text = BASE + toml
    if train:
        text += "[train]\n" + "".join(f"{k} = {v}\n" for k, v in train.items())
    return load_config_text(text)


@pytest.mark.parametrize(
    "toml, shape",
    [
        ("", WholeStep),
        ("[workflow]\nstream_step = true\n", StreamedStep),
        ("[algorithm]\ndynamic_sampling = true\n", DynamicSampling),
        (GATEWAY, GatewaySessions),
    ],
    ids=["whole", "streamed", "dynamic", "sessions"],
)
def test_each_config_asks_for_its_step_shape(toml, shape):
    assert source_for(cfg_of(toml)) is shape


@pytest.mark.parametrize(
    "toml, keys",
    [
        (
            "[workflow]\nstream_step = true\n[algorithm]\ndynamic_sampling = true\n",
            ("workflow.stream_step", "algorithm.dynamic_sampling"),
        ),
        (GATEWAY + "[workflow]\nstream_step = true\n", ("rollout.gateway.train", "workflow.stream_step")),
        (GATEWAY + "[algorithm]\ndynamic_sampling = true\n", ("rollout.gateway.train", "algorithm.dynamic_sampling")),
    ],
    ids=["streamed+dynamic", "sessions+streamed", "sessions+dynamic"],
)
def test_a_config_that_asks_for_two_step_shapes_is_refused_naming_both_keys(toml, keys):
    with pytest.raises(ConfigError) as err:
        check_step_shape(load_config_text(BASE + toml))
    for key in keys:
        assert f"{key} = false" in str(err.value), err.value


def test_sessions_refuse_a_critic_naming_the_fix():
    with pytest.raises(ConfigError, match=r"rollout.gateway.train = True: .*set algorithm.name = 'grpo'"):
        check_step_shape(load_config_text(BASE + GATEWAY + '[algorithm]\nname = "ppo"\n'))


# -- takes on a real queue ---------------------------------------------------------------


@pytest.fixture
def queue(tmp_path):
    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path / "ipc"))
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    q = spawn_queue(dc, transport, [TASK_TRAIN], 1, 4096, 4)
    tq = TQClient(DirectoryClient(directory.address, transport))
    yield tq
    tq.close()
    q.stop()
    directory.stop()


def context(tq: TQClient, cfg, checked: list | None = None) -> StepContext:
    """A step source's parts with a real queue and config; no policy or ranks (a take
    reads neither)."""
    return StepContext(
        run=types.SimpleNamespace(config=cfg),  # type: ignore[arg-type]
        tq=tq,
        policy=None,  # type: ignore[arg-type]
        ranks=types.SimpleNamespace(num_ranks=1),  # type: ignore[arg-type]
        acks=DeferredAcks(tq),
        columns=COLUMNS,
        activity=lambda name: contextlib.nullcontext(),
        check_versions=lambda meta: (checked.append(list(meta.indices)) if checked is not None else None) or {},
        tell=lambda name, msg: None,
        name="trainer",
    )


def put_groups(tq: TQClient, num_groups: int, group_size: int, step: int, version: int = 0, reward=None) -> list[int]:
    metas = tq.allocate(num_groups, group_size, step=step)
    for m in metas:
        m.version, m.response_len, m.prompt_len = version, 3, 2
    rewards = reward or [float(k % 2) for k in range(len(metas))]
    tq.put(
        [m.index for m in metas],
        {"response_ids": [np.arange(3) for _ in metas], "reward": [np.array([r], np.float32) for r in rewards]},
        metas,
    )
    return [m.index for m in metas]


def test_a_whole_step_takes_exactly_its_rows_and_asks_for_the_next_step_meanwhile(queue):
    cfg = cfg_of(prompts_per_step=2, num_steps=3)  # 2 groups of algorithm.group_size rows a step
    group = cfg.algorithm.group_size
    source = WholeStep(context(queue, cfg))
    first = put_groups(queue, 2, group, step=0)
    batch = source.take(0)
    assert isinstance(batch, Batch) and sorted(batch.meta.indices) == sorted(first) and not batch.prefetched
    second = put_groups(queue, 2, group, step=1)
    later = source.take(1)  # the request for step 1 went out while step 0 "trained"
    assert later is not None and sorted(later.meta.indices) == sorted(second) and later.prefetched
    source.close()


def test_sessions_too_old_for_a_step_are_dropped_and_audited_with_the_next_batch(queue):
    cfg = load_config_text(BASE + GATEWAY + "[workflow]\nstaleness = 1\n[train]\nprompts_per_step = 2\n")
    group = cfg.algorithm.group_size
    source = GatewaySessions(context(queue, cfg))
    old = put_groups(queue, 2, group, step=-1, version=0)  # too old for step 3 with k = 1 (version >= 2 needed)
    assert source.take(3) is None  # no fresh sessions yet
    fresh = put_groups(queue, 2, group, step=-1, version=2)
    batch = source.take(3)
    assert batch is not None and sorted(batch.meta.indices) == sorted(fresh)
    assert sorted(batch.audit["stale_sessions"]) == sorted(old) and batch.figures["sessions_stale"] == len(old)
    source.close()


class HalfStep(WholeStep):
    """A test-only step shape: a step trains on the first half of its prompt groups, and
    the rest are taken and dropped (acked with the step, listed in its audit line)."""

    key = "train.halve"

    @classmethod
    def wanted(cls, cfg) -> bool:
        return True

    def taken(self, step, meta, prefetched, started):
        groups = sorted({m.group_id for m in meta.metas})
        kept = set(groups[: len(groups) // 2])
        keep = [p for p, m in enumerate(meta.metas) if m.group_id in kept]
        drop = [meta.indices[p] for p, m in enumerate(meta.metas) if m.group_id not in kept]
        half = protocol.BatchMeta(
            task=meta.task,
            indices=[meta.indices[p] for p in keep],
            metas=[meta.metas[p] for p in keep],
            shards=[meta.shards[p] for p in keep] if meta.shards else [],
            parts=[list(range(len(keep)))],
        )
        return Batch(meta=half, integrity=self.ctx.check_versions(half), started=started, dropped=drop, audit={"halved": drop})


def test_a_new_step_shape_is_one_class_and_one_registry_line(queue, monkeypatch):
    """HalfStep above, and the one line that registers it: the config check picks it, and
    its take hands the trainer half of the step's groups, the rest to ack as dropped."""
    monkeypatch.setattr(sources, "SOURCES", [HalfStep, *SOURCES])
    cfg = cfg_of(prompts_per_step=4)
    assert source_for(cfg) is HalfStep
    checked: list = []
    source = source_for(cfg)(context(queue, cfg, checked))
    rows = put_groups(queue, 4, cfg.algorithm.group_size, step=0)
    batch = source.take(0)
    assert batch is not None
    assert len(batch.meta.indices) == len(rows) // 2 and sorted(batch.meta.indices + batch.dropped) == sorted(rows)
    assert batch.audit == {"halved": batch.dropped} and checked == [batch.meta.indices]  # versions checked: the trained rows
    source.close()
