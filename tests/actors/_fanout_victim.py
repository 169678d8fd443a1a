"""A light replica of the relay tree in a process of its own, for test_weight_fanout: it
serves a ``FanoutReplica`` (``bench/fanout.py``) as ``--name`` and prints READY; with
``--stall-version V --stall-index I`` its fetch of version V stops before chunk I, prints
STALLED, and goes on only when a line comes on stdin (the test kills or freezes this
process meanwhile)."""

from __future__ import annotations

import argparse
import signal
import sys

from asyncflow.actors.weights import _relay
from asyncflow.bench.fanout import FanoutReplica
from asyncflow.core.actor import serve_actor
from asyncflow.core.directory import DirectoryClient
from asyncflow.core.transport import TransportConfig


def stall_at(version: int, index: int) -> None:
    """Make this replica's fetch of ``version`` wait before chunk ``index`` until stdin says go."""
    chunk = _relay.RelayReceiver._chunk

    def stalling(self, weights, chain, at, v, i):
        if (v, i) == (version, index):
            print("STALLED", flush=True)
            sys.stdin.readline()
        return chunk(self, weights, chain, at, v, i)

    _relay.RelayReceiver._chunk = stalling  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--directory", required=True)
    ap.add_argument("--ipc-dir", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--timeout-s", type=float, required=True)
    ap.add_argument("--stall-version", type=int, default=-1)
    ap.add_argument("--stall-index", type=int, default=-1)
    args = ap.parse_args()
    if args.stall_version >= 0:
        stall_at(args.stall_version, args.stall_index)
    transport = TransportConfig(scheme="ipc", ipc_dir=args.ipc_dir)
    replica = serve_actor(
        FanoutReplica,
        args.name,
        transport,
        directory_address=args.directory,
        fanout="tree",
        timeout_s=args.timeout_s,
        check_bytes=True,
    )
    DirectoryClient(args.directory, transport).register(replica.entry())
    print("READY", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    replica.stop()


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
