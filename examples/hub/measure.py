"""Measure examples/hub: run ``afctl up examples/hub/hub.toml`` (the calculator task as an
OpenEnv environment, through asyncflow's OpenEnv adapter) and print one JSON line: the
trainer's mean reward and tool-call rate over the first and the last 10% of steps.

    python examples/hub/measure.py --out runs/hub-measure
    python examples/hub/measure.py --served          # the same environment served by OpenEnv's
                                                     # own server in another process, over its client
    python examples/hub/measure.py --lib verifiers   # the task as a verifiers environment
                                                     # (calc_verifiers.py; its rows as the data)

Needs openenv-core in this Python (``pip install -e '.[openenv]' (in the asyncflow checkout)``; verifiers too for
``--lib verifiers``: ``[hub]``); nothing is downloaded (the data and the tiny model are
built here). The tool-call rate is the OpenEnv environment's count (``metadata``), in
process only: OpenEnv's server leaves ``metadata`` out of what it sends, and the verifiers
adapter reports none.
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
    p.add_argument("--lib", choices=["openenv", "verifiers"], default="openenv", help="the library the task is written for")
    p.add_argument("--served", action="store_true", help="serve the OpenEnv environment with OpenEnv's server, play it over HTTP")
    p.add_argument("--set", action="append", default=[], help="config overrides for afctl up")
    args = p.parse_args()
    try:
        import openenv.core  # noqa: F401

        if args.lib == "verifiers":
            import verifiers.v1  # noqa: F401
    except ImportError as exc:
        raise SystemExit(
            f"examples/hub needs {exc.name} in this Python: pip install -e '.[hub]' (in the asyncflow checkout)"
        ) from None
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
        server = subprocess.Popen(
            [sys.executable, "-c", SERVE, str(sock.fileno()), str(HERE)],
            pass_fds=[sock.fileno()],
            stdout=open(out / "server.log", "w"),
            stderr=subprocess.STDOUT,
        )
        env["CALC_OPENENV_URL"] = f"http://127.0.0.1:{sock.getsockname()[1]}"
        sets += ["--set", "env.path=calc_openenv:CalcHubServed"]
    if args.lib == "verifiers":  # the taskset's rows are the run's data: prompt, and the task's key as the answer
        sys.path.insert(0, str(HERE))
        import calc_verifiers

        from asyncflow.envs.hub.verifiers import write_data

        data = write_data(calc_verifiers.CONFIG, out / "data.jsonl")
        sets += ["--set", f"data.path={data}", "--set", "env.path=calc_verifiers:CalcHub"]
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
        "env": f"{args.lib} {'served' if args.served else 'in process'}",
        "steps": len(steps),
        "reward_first_10pct": round(first, 4),
        "reward_last_10pct": round(last, 4),
        "ratio": round(last / first, 2) if first else None,
        **(
            {"tool_call_rate_first_10pct": round(calls_first, 4), "tool_call_rate_last_10pct": round(calls_last, 4)}
            if args.lib == "openenv" and not args.served
            else {}
        ),
        "env_error_rate_max": max(s.get("env/error_rate", 0.0) for s in steps),
        "wall_s": round(time.monotonic() - started),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
