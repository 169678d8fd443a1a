"""A weights actor with the local weight transport in its own process, for
test_weight_local: publishes a known tensor set as v1 (on ``--device``), prints
READY, and serves until the test closes its stdin (or kills it)."""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch

from asyncflow.actors.weights.actor import Publish, WeightSyncActor
from asyncflow.bench.weights import bench_run_dir
from asyncflow.config.names import WEIGHTS
from asyncflow.core.actor import serve_actor
from asyncflow.core.directory import DirectoryClient
from asyncflow.core.transport import TransportConfig


def tensors() -> list:
    g = torch.Generator().manual_seed(0)
    return [(f"layer{i}.weight", torch.randn(256, 1024, generator=g)) for i in range(4)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--directory", required=True)
    ap.add_argument("--ipc-dir", required=True)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    transport = TransportConfig(scheme="ipc", ipc_dir=args.ipc_dir)
    weights = serve_actor(
        WeightSyncActor,
        WEIGHTS,
        transport,
        directory_address=args.directory,
        run_dir=bench_run_dir(tempfile.mkdtemp(), substep_updates=True, transport="local", device=args.device),
        replicas=[],
        chunk_bytes=1 << 20,
    )
    DirectoryClient(args.directory, transport).register(weights.entry())
    weights.pykka_ref.ask(Publish(1, tensors()))
    print("READY", flush=True)
    sys.stdin.read()
    weights.stop()


if __name__ == "__main__":
    main()
