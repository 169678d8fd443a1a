"""Time to start N process hosts under Ray, one after another (each placed, started and
registered before the next: how every host started before the hosts were launched in waves) and as one launch
wave (``RayHosts.spawn_many``: all placed, started and registered together), on a
throwaway local Ray cluster on 127.0.0.1 (tests/ray/_ray_head.py).

    python scripts/ray_spawn_bench.py [--hosts 8,16,24] [--ray-cpus 8]

Prints one row per N: seconds for the serial start, for the wave, and their ratio.
The hosts are empty process hosts (no actors): the figure is the launcher's own cost.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="8,16,24", help="comma-separated host counts")
    parser.add_argument("--ray-cpus", type=int, default=8, help="CPUs the local Ray cluster declares")
    args = parser.parse_args()
    counts = [int(n) for n in args.hosts.split(",")]

    from asyncflow.actors.driver.ray_hosts import LOOPBACK_ENV
    from asyncflow.core.host import PARENT_ENV

    os.environ.update(
        {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0", **LOOPBACK_ENV}
    )
    os.environ.pop("RAY_ADDRESS", None)
    head = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "ray" / "_ray_head.py"), str(args.ray_cpus)],
        env=dict(os.environ, **{PARENT_ENV: str(os.getpid())}),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        address = head.stdout.readline().strip()
        if not address:
            sys.exit(f"the local Ray cluster did not start (exit {head.wait(timeout=60)})")
        os.environ["RAY_ADDRESS"] = address
        rows = measure(counts)
    finally:
        head.stdin.close()
        head.wait(timeout=120)
    print(
        f"\nstart N empty process hosts under Ray (local cluster on 127.0.0.1, {args.ray_cpus} CPUs declared, {os.cpu_count()} cores)"
    )
    print(f"{'hosts':>6} {'serial s':>9} {'wave s':>7} {'serial/wave':>12} {'serial s/host':>14} {'wave s/host':>12}")
    for n, serial_s, wave_s in rows:
        print(f"{n:>6} {serial_s:>9.1f} {wave_s:>7.1f} {serial_s / wave_s:>11.1f}x {serial_s / n:>14.2f} {wave_s / n:>12.2f}")


def measure(counts: list[int]) -> list[tuple[int, float, float]]:
    import ray

    from asyncflow.actors.driver.ray_hosts import RayHosts
    from asyncflow.config.cluster import ClusterConfig
    from asyncflow.core.directory import DirectoryClient, start_directory
    from asyncflow.core.transport import TransportConfig

    hosts = RayHosts(ClusterConfig(launcher="ray"), lambda host: 0)
    transport = hosts.connect(TransportConfig(scheme="tcp", bind_host="127.0.0.1", secret=secrets.token_hex(16)))
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    total_cpu = ray.cluster_resources()["CPU"]

    def settle() -> None:  # every reservation of the last round given back
        for host in list(hosts.handles.values()):
            host.kill()
        hosts.handles.clear()
        deadline = time.monotonic() + 60
        while ray.available_resources().get("CPU", 0.0) < total_cpu and time.monotonic() < deadline:
            time.sleep(0.2)

    rows = []
    try:
        for n in counts:
            started = time.monotonic()
            for i in range(n):
                hosts.spawn(f"serial{n}.{i}", dc, transport, timeout_s=300)
            serial_s = time.monotonic() - started
            settle()
            started = time.monotonic()
            hosts.spawn_many(dc, transport, {f"wave{n}.{i}": {} for i in range(n)}, timeout_s=300)
            wave_s = time.monotonic() - started
            settle()
            rows.append((n, serial_s, wave_s))
            print(f"{n} hosts: serial {serial_s:.1f} s, wave {wave_s:.1f} s", flush=True)
    finally:
        settle()
        directory.stop()
        hosts.close()
    return rows


if __name__ == "__main__":
    main()
