"""A weights actor in its own process for test_weight_collective: publishes a
known tensor set, prints READY; with --stall-at N it prints STREAMING and blocks
before chunk N of its first stream (the test then kills this process)."""

from __future__ import annotations

import argparse
import sys
import threading

import torch

from asyncflow.actors.weight_sync import WEIGHTS_NAME, WeightSyncActor
from asyncflow.core.actor import serve_actor
from asyncflow.core.directory import DirectoryClient
from asyncflow.core.transport import TransportConfig


def tensors() -> list:
    g = torch.Generator().manual_seed(0)
    return [(f"layer{i}.weight", torch.randn(256, 1024, generator=g)) for i in range(4)]


class StallingWeights(WeightSyncActor):
    """Blocks its first stream before chunk ``stall_at`` (after telling the test)."""

    def __init__(self, ctx, stall_at: int, **kwargs):
        super().__init__(ctx, **kwargs)
        forever = threading.Event()

        def before_chunk(i: int) -> None:
            if i == stall_at:
                print("STREAMING", flush=True)
                forever.wait()

        self._before_chunk = before_chunk


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--directory", required=True)
    ap.add_argument("--ipc-dir", required=True)
    ap.add_argument("--stall-at", type=int, default=-1)
    args = ap.parse_args()
    transport = TransportConfig(scheme="ipc", ipc_dir=args.ipc_dir)
    weights = serve_actor(StallingWeights, WEIGHTS_NAME, transport, directory_address=args.directory,
                          stall_at=args.stall_at, replicas=[], substep=True,
                          chunk_bytes=1 << 20)  # one 1 MiB tensor per chunk
    DirectoryClient(args.directory, transport).register(weights.entry())
    weights.pykka_ref.proxy().publish(1, tensors()).get()
    print("READY", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or kills us)
    weights.stop()


if __name__ == "__main__":
    main()
