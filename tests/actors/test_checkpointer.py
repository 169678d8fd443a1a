"""The trainer's Checkpointer (actors/trainer/checkpointer.py) on a real queue and run
directory, without a trainer process: what a checkpoint holds, the link to the newest,
pruning, and a save that fails leaving the last good checkpoint in place."""

from __future__ import annotations

import types

import pytest

from asyncflow.actors.trainer.checkpointer import Checkpointer
from asyncflow.actors.trainer.checkpoints import LATEST, checkpoint_dir, latest_good_checkpoint
from asyncflow.config.load import load_config_text
from asyncflow.config.names import TASK_TRAIN
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.disk_space import DiskFull
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.launch import spawn_queue
from asyncflow.core.transport import TransportConfig

pytestmark = pytest.mark.timeout(60)


class Policy:
    """The policy's part of a checkpoint: its model directory (the engine's save is tested
    with the engines); ``fail`` makes the save raise like a full disk."""

    fail = False

    def save(self, path):
        if self.fail:
            raise OSError(28, "No space left on device")
        (path / "model").mkdir()
        (path / "model" / "weights.bin").write_bytes(b"w" * 64)


@pytest.fixture
def checkpointer(tmp_path):
    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path / "ipc"))
    directory = start_directory(transport)
    queue = spawn_queue(DirectoryClient(directory.address, transport), transport, [TASK_TRAIN], 1, 1024, 4)
    tq = TQClient(DirectoryClient(directory.address, transport))
    cfg = load_config_text('[model]\ntiny = "qwen2"\n[train]\nnum_steps = 10\ncheckpoint_every = 2\nkeep_checkpoints = 2\n')
    settled: list[int] = []

    def no_roster(name):
        raise LookupError(name)  # no driver here: the replicas at start (none) are paused

    run = types.SimpleNamespace(config=cfg, dir=tmp_path / "run")
    run.dir.mkdir()
    ranks = types.SimpleNamespace(save_checkpoint=lambda path: None)
    yield Checkpointer(run, tq, Policy(), ranks, [], [], no_roster, settle=lambda: settled.append(1)), settled  # type: ignore[arg-type]
    tq.close()
    queue.stop()
    directory.stop()


def test_a_checkpoint_holds_the_queue_model_and_roles_verifies_and_is_linked_and_old_ones_go(checkpointer):
    saver, settled = checkpointer
    assert [s for s in range(1, 11) if saver.due(s)] == [2, 4, 6, 8]  # after every 2 steps; the end saves by itself
    for step in (2, 4, 6):
        path = saver.save(step)
    assert len(settled) == 3  # the trainer's own work settled before each
    assert path == checkpoint_dir(saver.run.dir, 6)
    assert {p.name for p in path.iterdir()} >= {"queue", "model", "roles.msgpack", "MANIFEST.json", "DONE"}
    assert (path / "DONE").read_text() == "6\n"
    assert latest_good_checkpoint(saver.run.dir) == (path, [])  # the manifest verifies
    link = saver.run.dir / "checkpoints" / LATEST
    assert link.resolve() == (path / "model").resolve()
    kept = sorted(p.name for p in (saver.run.dir / "checkpoints").glob("step_*"))
    assert kept == ["step_000004", "step_000006"]  # train.keep_checkpoints = 2
    saver.close()


def test_a_save_that_fails_leaves_the_last_good_checkpoint_linked(checkpointer):
    saver, _ = checkpointer
    good = saver.save(2)
    saver.policy.fail = True
    with pytest.raises(DiskFull, match=r"no space left on device: .*step_000004\.tmp .*the checkpoint after step 4"):
        saver.save(4)  # ENOSPC: named as a full disk, with the path and the fix
    assert not checkpoint_dir(saver.run.dir, 4).exists()  # only its .tmp: never taken for complete
    assert latest_good_checkpoint(saver.run.dir) == (good, [])
    assert (saver.run.dir / "checkpoints" / LATEST).resolve() == (good / "model").resolve()
    saver.close()
