"""Measure examples/hub: run ``afctl up examples/hub/hub.toml`` (the calculator task as an
OpenEnv environment, through asyncflow's OpenEnv adapter) and print one JSON line: the
trainer's mean reward and tool-call rate over the first and the last 10% of steps.

    python examples/hub/measure.py --out runs/hub-measure
    python examples/hub/measure.py --served    # the same environment served by OpenEnv's
                                               # own server in another process, over its client

Needs openenv-core in this Python (``pip install 'asyncflow[openenv]'``); nothing is
downloaded (the data and the tiny model are built by the run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SERVE = (
    "import sys, uvicorn; sys.path.insert(0, sys.argv[2]);"
    "from openenv.core.env_server.http_server import create_fastapi_app;"
    "from calc_openenv import Calculator, CalcAction, CalcObservation;"
    "uvicorn.run(create_fastapi_app(Calculator, CalcAction, CalcObservation, max_concurrent_envs=512),"
    " fd=int(sys.argv[1]), log_level='warning')"
)


def tenth_means(xs: list[float]) -> tuple[float, float]:
    n = max(1, len(xs) // 10)
    return sum(xs[:n]) / n, sum(xs[-n:]) / n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/hub-measure")
    p.add_argument("--served", action="store_true", help="serve the environment with OpenEnv's server and play it over HTTP")
    p.add_argument("--set", action="append", default=[], help="config overrides for afctl up")
    args = p.parse_args()
    try:
        import openenv.core  # noqa: F401
    except ImportError:
        raise SystemExit("examples/hub needs openenv-core in this Python: pip install 'asyncflow[openenv]'") from None
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    run_dir = out / "run"
    sets = [x for s in args.set for x in ("--set", s)]
    env = dict(os.environ)
    server = sock = None
    if args.served:  # listening before the run starts: the first connection waits in the backlog
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        server = subprocess.Popen([sys.executable, "-c", SERVE, str(sock.fileno()), str(HERE)], pass_fds=[sock.fileno()])
        env["CALC_OPENENV_URL"] = f"http://127.0.0.1:{sock.getsockname()[1]}"
        sets += ["--set", "env.path=calc_openenv:CalcHubServed"]
    started = time.monotonic()
    try:
        code = subprocess.run(
            [sys.executable, "-m", "asyncflow.cli.main", "up", str(HERE / "hub.toml"), "--run-dir", str(run_dir), *sets],
            stdout=open(out / "afctl.log", "w"),
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        ).returncode
    finally:
        if server is not None and sock is not None:
            server.kill()
            server.wait()
            sock.close()
    if code != 0:
        raise SystemExit(f"afctl up failed ({code}): {out / 'afctl.log'}")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "reward_mean" in s]
    first, last = tenth_means([s["reward_mean"] for s in steps])
    calls_first, calls_last = tenth_means([s.get("env/tool_call_rate", 0.0) for s in steps])
    result = {
        "env": "openenv served" if args.served else "openenv in process",
        "steps": len(steps),
        "reward_first_10pct": round(first, 4),
        "reward_last_10pct": round(last, 4),
        "ratio": round(last / first, 2) if first else None,
        "tool_call_rate_first_10pct": round(calls_first, 4),
        "tool_call_rate_last_10pct": round(calls_last, 4),
        "env_error_rate_max": max(s.get("env/error_rate", 0.0) for s in steps),
        "wall_s": round(time.monotonic() - started),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
