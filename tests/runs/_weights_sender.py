"""A weights actor in its own process for test_weight_collective: publishes a
known tensor set, prints READY; with --stall-at N it prints STREAMING and blocks
its first stream before chunk N (the test then kills this process)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading

import torch

from asyncflow.actors.weights import collective as _collective
from asyncflow.actors.weights.actor import Publish, WeightSyncActor
from asyncflow.bench.weights import bench_run_dir
from asyncflow.config.names import WEIGHTS
from asyncflow.core.actor import serve_actor
from asyncflow.core.directory import DirectoryClient
from asyncflow.core.transport import TransportConfig


def tensors() -> list:
    g = torch.Generator().manual_seed(0)
    return [(f"layer{i}.weight", torch.randn(256, 1024, generator=g)) for i in range(4)]


def stall_before_chunk(stall_at: int) -> None:
    """Make the sender's first stream block before packing chunk ``stall_at``."""
    pack, packed, forever = _collective.pack, [0], threading.Event()

    def stalling_pack(*args):
        if packed[0] == stall_at:
            print("STREAMING", flush=True)
            forever.wait()
        packed[0] += 1
        return pack(*args)

    _collective.pack = stalling_pack


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--directory", required=True)
    ap.add_argument("--ipc-dir", required=True)
    ap.add_argument("--stall-at", type=int, default=-1)
    args = ap.parse_args()
    if args.stall_at >= 0:
        stall_before_chunk(args.stall_at)
    transport = TransportConfig(scheme="ipc", ipc_dir=args.ipc_dir)
    weights = serve_actor(
        WeightSyncActor,
        WEIGHTS,
        transport,
        directory_address=args.directory,
        run_dir=bench_run_dir(tempfile.mkdtemp(), substep_updates=True),
        replicas=[],
        chunk_bytes=1 << 20,
    )  # one 1 MiB tensor per chunk
    DirectoryClient(args.directory, transport).register(weights.entry())
    weights.pykka_ref.ask(Publish(1, tensors()))
    print("READY", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or kills us)
    weights.stop()


if __name__ == "__main__":
    main()
