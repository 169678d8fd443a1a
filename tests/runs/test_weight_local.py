"""The local weight transport (workflow.weight_transport = "local"): versions written
once to /dev/shm and mapped by the replicas on the trainer's host; real nng, real
processes, a real run. The CUDA IPC test needs a CUDA GPU."""

from __future__ import annotations

import glob
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from wf_helpers import afctl, read_jsonl, write_config

from asyncflow.actors.runtime import messages
from asyncflow.actors.weights import build_receiver
from asyncflow.actors.weights.actor import Publish, WeightSyncActor
from asyncflow.actors.weights.local import ENTRY, ENTRY_KIND, LocalReceiver, run_tag
from asyncflow.bench.weights import bench_run_dir
from asyncflow.config.names import WEIGHTS
from asyncflow.core import protocol
from asyncflow.core.actor import serve_actor
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.transport import TransportConfig

HERE = Path(__file__).resolve().parent


def _tensor_set(seed: int) -> list:
    """Every dtype a model exports, odd sizes (alignment), a scalar, an empty tensor."""
    g = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(300, 1000, generator=g)),
        ("norm.weight", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("proj.weight", torch.randn(33, 5, generator=g).to(torch.float16)),
        ("position_ids", torch.arange(11)),
        ("scale", torch.tensor(3.5)),
        ("empty", torch.empty(0, 4)),
        ("mask", torch.tensor([True, False, True])),
    ]


def _assert_same(sent: list, got: list, device_type: str = "cpu") -> None:
    assert [n for n, _ in got] == [n for n, _ in sent]
    for (name, a), (_, b) in zip(sent, got):
        assert b.device.type == device_type, name
        assert b.dtype == a.dtype and b.shape == a.shape, name
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.cpu().reshape(-1).view(torch.uint8)), name


def _files(prefix: str) -> list[str]:
    return sorted(glob.glob(prefix + "-v*"))


def _wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.05)


class InProcess:
    """A directory and a weights actor (local transport) in this process; the receiver is this thread."""

    def __init__(self, tmp_path: Path):
        self.transport = TransportConfig(scheme="inproc")
        self.directory = start_directory(self.transport)
        self.dc = DirectoryClient(self.directory.address, self.transport)
        (tmp_path / "run").mkdir()
        self.weights = serve_actor(
            WeightSyncActor,
            WEIGHTS,
            self.transport,
            directory_address=self.directory.address,
            run_dir=bench_run_dir(str(tmp_path / "run"), substep_updates=True, transport="local"),
            replicas=[],
            chunk_bytes=1 << 20,
        )
        self.dc.register(self.weights.entry())
        self.prefix = self.dc.lookup(ENTRY).address.removeprefix("shm://").split("|")[0]

    def publish(self, version: int, named: list) -> None:
        self.weights.pykka_ref.ask(Publish(version, named))

    def ref(self):
        return self.dc.ref(WEIGHTS)

    def receiver(self) -> LocalReceiver:
        return LocalReceiver(self.dc, "rollout.0", torch.device("cpu"), timeout_s=20.0)

    def close(self) -> None:
        self.weights.stop()
        self.directory.stop()


@pytest.mark.timeout(60)
def test_a_replica_on_the_trainers_host_maps_each_version_and_only_the_two_newest_files_stay(tmp_path):
    side = InProcess(tmp_path)
    try:
        receiver = side.receiver()
        sent = _tensor_set(0)
        side.publish(1, sent)
        version, got = receiver.fetch(side.ref())
        assert version == 1
        _assert_same(sent, got)
        assert receiver.num_mapped == 1 and receiver.fallback_why == ""
        stats = side.ref().ask(messages.GetWeightSyncStats(), timeout_s=10)
        assert stats.num_chunks_served == 0  # no chunk pulled: the replica mapped the file
        side.publish(2, _tensor_set(1))
        side.publish(3, _tensor_set(2))
        assert _files(side.prefix) == [side.prefix + "-v2", side.prefix + "-v3"]
        # announced v1, long superseded: the newest instead
        stale = messages.WeightsReady(version=1, num_chunks=1, num_bytes=1)
        version, got = receiver.fetch(side.ref(), announced=stale)
        assert version == 3
        _assert_same(_tensor_set(2), got)
    finally:
        side.close()
    assert _files(side.prefix) == []
    assert not glob.glob(side.prefix + "*")


@pytest.mark.timeout(60)
def test_an_overwritten_or_short_file_is_refetched_over_nng_and_the_log_names_the_cause(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    side = InProcess(tmp_path)
    try:
        receiver = side.receiver()
        sent = _tensor_set(0)
        side.publish(1, sent)
        path = side.prefix + "-v1"
        with open(path, "r+b") as f:  # the first element of the first tensor: always in the digest's sample
            data = bytearray(f.read())
            start = len(data) - sum(-(-t.numel() * t.element_size() // 64) * 64 for _, t in sent)
            data[start : start + 4] = b"\x00\x00\xc0\x7f"
            f.seek(0)
            f.write(data)
        version, got = receiver.fetch(side.ref())
        assert version == 1
        _assert_same(sent, got)  # the trainer's bytes, over nng: not the file's
        assert receiver.num_refetched == 1
        assert "does not hold the bytes the trainer wrote" in caplog.text and "over nng instead" in caplog.text

        sent = _tensor_set(1)
        side.publish(2, sent)
        os.truncate(side.prefix + "-v2", os.path.getsize(side.prefix + "-v2") // 2)
        version, got = receiver.fetch(side.ref())
        assert version == 2
        _assert_same(sent, got)
        assert receiver.num_refetched == 2 and "is short" in caplog.text
        assert receiver.fallback_why == ""  # the next version is mapped again
    finally:
        side.close()


@pytest.mark.timeout(60)
def test_a_replica_on_another_host_fetches_over_nng_and_says_why(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    side = InProcess(tmp_path)
    try:
        entry = side.dc.lookup(ENTRY)
        side.dc.register(
            protocol.ActorEntry(name=ENTRY, address=entry.address, host="another-node", pid=entry.pid, kind=ENTRY_KIND)
        )
        receiver = side.receiver()
        sent = _tensor_set(0)
        side.publish(1, sent)
        version, got = receiver.fetch(side.ref())
        assert version == 1
        _assert_same(sent, got)
        assert "another-node" in receiver.fallback_why and receiver.num_mapped == 0
        assert "weight transport 'local' unavailable" in caplog.text and "using nng" in caplog.text
    finally:
        side.close()


@pytest.mark.timeout(60)
def test_a_trainer_that_cannot_write_its_versions_says_how_to_fix_it_and_replicas_fetch_over_nng(tmp_path, monkeypatch, caplog):
    from asyncflow.actors.weights import local

    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(local, "SHM_DIR", str(tmp_path / "no-such-shm"))  # what a full or missing /dev/shm does
    side = InProcess(tmp_path)
    try:
        receiver = side.receiver()
        sent = _tensor_set(0)
        side.publish(1, sent)
        assert "could not write weights v1" in caplog.text and "--shm-size" in caplog.text
        version, got = receiver.fetch(side.ref())
        assert version == 1
        _assert_same(sent, got)
        assert "the trainer could not write it" in receiver.fallback_why and "using nng" in caplog.text
    finally:
        side.close()


@pytest.mark.timeout(60)
def test_the_config_builds_the_local_receiver():
    class Ctx:
        directory = None
        name = "rollout.0"

    assert isinstance(build_receiver("local", Ctx(), 10.0), LocalReceiver)


def _sender(tmp_path: Path, directory, device: str = "cpu") -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_local_sender.py"), "--directory", directory.address, "--ipc-dir", str(tmp_path)]
        + ["--device", device],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "READY"
    return proc


@pytest.mark.timeout(90)
def test_a_killed_trainer_leaves_no_file_behind_and_its_restart_is_mapped_again(tmp_path):
    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path))
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    proc = _sender(tmp_path, directory)
    try:
        prefix = dc.lookup(ENTRY).address.removeprefix("shm://").split("|")[0]
        receiver = LocalReceiver(dc, "rollout.0", torch.device("cpu"), timeout_s=20.0)
        version, got = receiver.fetch(dc.ref(WEIGHTS))  # across processes
        sys.path.insert(0, str(HERE))
        from _local_sender import tensors

        assert version == 1 and receiver.num_mapped == 1
        _assert_same(tensors(), got)
        assert _files(prefix) == [prefix + "-v1"]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        _wait_until(lambda: not glob.glob(prefix + "*"), 30, f"the watchdog removes {prefix}-*")
        _assert_same(tensors(), got)  # a mapping outlives its file

        # the restarted trainer (a new process: a new prefix) is mapped again, not fetched over nng
        dc.unregister(WEIGHTS)
        proc = _sender(tmp_path, directory)
        version, got = receiver.fetch(dc.ref(WEIGHTS, wait_s=10, refresh=True))
        assert version == 1 and receiver.num_mapped == 2 and receiver.fallback_why == ""
        _assert_same(tensors(), got)
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=30)
        directory.stop()
    assert not glob.glob(prefix.rsplit("-", 1)[0] + "-*")  # the second one's files too, at its stop


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")
@pytest.mark.timeout(120)
def test_on_cuda_a_replica_on_the_trainers_gpu_gets_the_version_through_a_cuda_ipc_handle(tmp_path):
    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path))
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    proc = _sender(tmp_path, directory, device="cuda")
    try:
        assert dc.lookup(ENTRY).address.split("|")[1] == "cuda"
        receiver = LocalReceiver(dc, "rollout.0", torch.device("cuda", 0), timeout_s=60.0)
        version, got = receiver.fetch(dc.ref(WEIGHTS))
        sys.path.insert(0, str(HERE))
        from _local_sender import tensors

        assert version == 1 and receiver.num_mapped == 1 and receiver.fallback_why == ""
        _assert_same(tensors(), got, device_type="cuda")
        stats = dc.ref(WEIGHTS).ask(messages.GetWeightSyncStats(), timeout_s=10)
        assert stats.num_chunks_served == 0
        del got
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        directory.stop()


@pytest.mark.slow  # a real run of the tiny model
@pytest.mark.timeout(240)
def test_a_run_with_the_local_weight_transport_trains_and_leaves_no_file_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("ASYNCFLOW_LOG", "INFO")
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, num_steps=4)
    config.write_text(config.read_text().replace("[workflow]\n", '[workflow]\nweight_transport = "local"\n'))
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=220)
    assert proc.returncode == 0, out
    assert "done: 4 steps" in out
    assert "mapping weights from" in out, out
    assert "fetching weights failed" not in out and "using nng" not in out and "over nng instead" not in out, out
    trained = read_jsonl(run_dir / "trained.jsonl")
    versions = sorted({v for line in trained for v in line["versions"]})
    assert versions[-1] >= 2, versions  # the replica swapped in versions it mapped (digests checked: verify_weights)
    assert all(line["step"] - v <= 1 for line in trained for v in line["versions"])
    assert not glob.glob(f"/dev/shm/asyncflow-weights-{run_tag(str(run_dir))}-*")
