"""The device-collective weight channel (workflow.weight_transport = "collective"):
real gloo groups, real nng, real processes. The nccl test needs a CUDA GPU."""

from __future__ import annotations

import json
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
from asyncflow.actors.weights.collective import CollectiveReceiver
from asyncflow.bench.weights import bench_run_dir
from asyncflow.config.names import WEIGHTS
from asyncflow.core.actor import serve_actor
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.transport import TransportConfig

HERE = Path(__file__).resolve().parent


def _tensor_set(seed: int) -> list:
    """Every dtype a model exports, odd sizes (alignment), a scalar, an empty tensor."""
    g = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(300, 1000, generator=g)),  # 1.2 MB: a chunk of its own
        ("norm.weight", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("proj.weight", torch.randn(33, 5, generator=g).to(torch.float16)),
        ("position_ids", torch.arange(11)),
        ("scale", torch.tensor(3.5)),
        ("empty", torch.empty(0, 4)),
        ("mask", torch.tensor([True, False, True])),
    ]


class InProcess:
    """A directory and a weights actor in this process (inproc nng); the receiver is this thread."""

    def __init__(self, run_dir: Path, device: str = "cpu"):
        self.transport = TransportConfig(scheme="inproc")
        self.directory = start_directory(self.transport)
        self.dc = DirectoryClient(self.directory.address, self.transport)
        self.weights = serve_actor(
            WeightSyncActor,
            WEIGHTS,
            self.transport,
            directory_address=self.directory.address,
            run_dir=bench_run_dir(str(run_dir), substep_updates=True),
            replicas=[],
            chunk_bytes=1 << 20,
        )
        self.dc.register(self.weights.entry())
        self.device = torch.device(device)

    def publish(self, version: int, named: list) -> None:
        self.weights.pykka_ref.ask(Publish(version, named))

    def receiver(self, replica: str = "rollout.0", timeout_s: float = 20.0) -> CollectiveReceiver:
        return CollectiveReceiver(self.dc, self.transport, replica, self.device, timeout_s=timeout_s)

    def close(self) -> None:
        self.weights.stop()
        self.directory.stop()


def _assert_same(sent: list, got: list, device: torch.device) -> None:
    assert [n for n, _ in got] == [n for n, _ in sent]
    for (name, a), (_, b) in zip(sent, got):
        assert b.device.type == device.type, name
        assert b.dtype == a.dtype and b.shape == a.shape, name
        # bit-exact: compare the raw bytes, not the values (NaN-safe, -0.0-safe)
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.cpu().reshape(-1).view(torch.uint8)), name


@pytest.mark.timeout(60)
def test_a_named_tensor_set_moves_bit_exactly_and_the_group_is_reused_for_the_next_version(tmp_path):
    side = InProcess(tmp_path)
    try:
        receiver = side.receiver()
        weights = side.dc.ref(WEIGHTS)
        sent = _tensor_set(0)
        side.publish(1, sent)
        chunks_seen: list[int] = []
        version, got = receiver.fetch(weights, on_chunk=chunks_seen.append)
        assert version == 1 and len(chunks_seen) >= 2  # the 1.2 MB tensor travels in its own broadcast
        _assert_same(sent, got, side.device)
        group = receiver.group
        assert [e.name for e in side.dc.list("dist.weights.")] == [f"dist.{group}"]

        sent2 = _tensor_set(1)
        side.publish(2, sent2)
        version, got = receiver.fetch(weights)
        assert version == 2 and receiver.group == group  # same group, no new rendezvous
        _assert_same(sent2, got, side.device)

        # a second replica gets a group of its own, and the first one still works after it
        other = side.receiver("rollout.1")
        assert other.fetch(weights)[0] == 2 and other.group != group
        assert receiver.fetch(weights)[0] == 2
        # a replica stopped by the planner: its group's store leaves the directory
        weights.ask(messages.ReplicaRemoved(replica="rollout.1"), timeout_s=10)
        assert {e.name for e in side.dc.list("dist.weights.")} == {f"dist.{group}"}
    finally:
        side.close()


@pytest.mark.timeout(60)
def test_a_replica_that_gives_up_mid_stream_gets_the_next_version_over_a_fresh_group(tmp_path):
    side = InProcess(tmp_path)
    try:
        side.publish(1, _tensor_set(0))
        receiver = side.receiver(timeout_s=10)
        weights = side.dc.ref(WEIGHTS)

        def give_up(i: int) -> None:
            raise ConnectionError("replica gave up after chunk 0")

        with pytest.raises(ConnectionError):
            receiver.fetch(weights, on_chunk=give_up)
        assert receiver.group is None  # its side of the group is closed
        sent = _tensor_set(1)
        side.publish(2, sent)
        version, got = receiver.fetch(weights)  # the sender drops the old group for the new one
        assert version == 2
        _assert_same(sent, got, side.device)
        assert [e.name for e in side.dc.list("dist.weights.")] == [f"dist.{receiver.group}"]
    finally:
        side.close()


@pytest.mark.timeout(60)
def test_a_backend_the_trainer_side_lacks_is_refused_so_the_replica_falls_back_to_nng(tmp_path, caplog):
    side = InProcess(tmp_path)
    try:
        sent = _tensor_set(0)
        side.publish(1, sent)
        receiver = side.receiver()
        receiver.backend = "no-such-backend"  # what a cuda replica meets at a trainer without CUDA
        version, got = receiver.fetch(side.dc.ref(WEIGHTS))
        assert version == 1 and receiver.num_streams == 0  # the bytes came as nng chunks
        _assert_same(sent, got, torch.device("cpu"))
        assert "unknown backend" in caplog.text and "using nng" in caplog.text
        assert side.dc.list("dist.weights.") == []  # nothing was set up
        side.publish(2, _tensor_set(1))
        assert receiver.fetch(side.dc.ref(WEIGHTS))[0] == 2 and receiver.num_streams == 0  # nng for good
    finally:
        side.close()


@pytest.mark.timeout(30)
def test_a_replica_that_cannot_build_its_collective_side_uses_nng(tmp_path, caplog):
    class Ctx:  # what build_receiver reads of an actor context
        name, directory, transport = "rollout.0", None, TransportConfig(scheme="inproc")

    receiver = build_receiver("collective", Ctx(), 10.0, device="meta")  # no torch.distributed backend
    assert type(receiver).__name__ == "NngReceiver"
    assert "weight transport 'collective' unavailable on this replica" in caplog.text


@pytest.mark.timeout(90)
def test_a_receiver_whose_sender_dies_mid_stream_fails_within_the_timeout_and_retries_on_a_new_group(tmp_path):
    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path))
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    timeout_s = 20.0

    def sender(stall_at: int) -> subprocess.Popen:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "_weights_sender.py"),
                "--directory",
                directory.address,
                "--ipc-dir",
                str(tmp_path),
                "--stall-at",
                str(stall_at),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().strip() == "READY"
        return proc

    procs = []
    try:
        procs.append(first := sender(stall_at=2))
        receiver = CollectiveReceiver(dc, transport, "rollout.0", torch.device("cpu"), timeout_s=timeout_s)
        chunks_seen: list[int] = []
        killed_at: list[float] = []

        def on_chunk(i: int) -> None:
            chunks_seen.append(i)
            if i == 1:  # the sender stalls before chunk 2 and says so: kill it there
                assert first.stdout.readline().strip() == "STREAMING"
                first.kill()
                first.wait()
                killed_at.append(time.monotonic())

        with pytest.raises(Exception) as failed:
            receiver.fetch(dc.ref(WEIGHTS, refresh=True), on_chunk=on_chunk)
        waited = time.monotonic() - killed_at[0]
        print(f"receiver failed {waited:.2f} s after its sender died: {failed.value!r}")
        assert chunks_seen == [0, 1]
        assert waited < timeout_s + 5
        assert receiver.group is None  # closed: the next fetch builds a new group

        # the restarted sender (a new weights actor) streams over a fresh group
        dc.unregister(WEIGHTS)
        procs.append(sender(stall_at=-1))
        version, got = receiver.fetch(dc.ref(WEIGHTS, wait_s=10, refresh=True))
        assert version == 1 and len(got) == 4
        sys.path.insert(0, str(HERE))
        from _weights_sender import tensors

        _assert_same(tensors(), got, torch.device("cpu"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.stdin.close()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        directory.stop()


@pytest.mark.slow  # 17 s: -m slow (suite time); the transport itself is tested above and at real size (test_real_sizes)
@pytest.mark.timeout(240)
def test_a_run_with_the_collective_weight_transport_completes_and_rollout_versions_advance(tmp_path, monkeypatch):
    monkeypatch.setenv("ASYNCFLOW_LOG", "INFO")
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, num_steps=4)
    config.write_text(config.read_text().replace("[workflow]\n", '[workflow]\nweight_transport = "collective"\n'))
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=220)
    assert proc.returncode == 0, out
    assert "done: 4 steps" in out
    assert "receiving weights over gloo" in out, out
    assert "fetching weights failed" not in out and "using nng" not in out, out
    trained = read_jsonl(run_dir / "trained.jsonl")
    versions = sorted({v for line in trained for v in line["versions"]})
    assert versions[-1] >= 2, versions  # the replica swapped in weights streamed by the trainer
    assert all(line["step"] - v <= 1 for line in trained for v in line["versions"])


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_nccl_moves_the_tensor_set_into_the_replicas_gpu_memory(tmp_path):
    # NCCL refuses two ranks on one GPU: the sender uses cuda:0 (its current device), the receiver cuda:1
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    side = InProcess(tmp_path, device="cuda:1")
    try:
        receiver = side.receiver()
        assert receiver.backend == "nccl"
        sent = _tensor_set(0)
        side.publish(1, sent)
        version, got = receiver.fetch(side.dc.ref(WEIGHTS))
        assert version == 1
        _assert_same(sent, got, side.device)
        side.publish(2, _tensor_set(1))
        assert receiver.fetch(side.dc.ref(WEIGHTS))[0] == 2
    finally:
        side.close()


@pytest.mark.timeout(90)
def test_afctl_bench_weights_prints_the_transports_side_by_side():
    from click.testing import CliRunner

    from asyncflow.cli.main import main

    result = CliRunner().invoke(
        main, ["bench", "weights", "--mb", "2", "--tensor-mb", "0.5", "--chunk-mb", "1", "--repeats", "1", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output.strip().splitlines()[-1])["rows"]
    assert [r["transport"] for r in rows] == ["nng", "local (shm)", "collective (gloo)"]
    assert all(r["bytes"] == 2 << 20 and r["tensors"] == 4 and r["gb_per_s"] > 0 and r["loaded_gb_per_s"] > 0 for r in rows)
