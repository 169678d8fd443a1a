"""Measure examples/agent: start ``afctl up`` on an example's config, run the agent
(``agent.py``, its own process, only the openai client) against the run's gateway
until the run ends, and print one JSON line: the agent's mean reward over its first
and last 10% of episodes (in the order they finished), the trainer's view, and the
run's own account (summary.json: sessions trained and discarded as stale).

    python examples/agent/measure.py --out runs/agent-measure                       # the tiny model, calculator tool
    python examples/agent/measure.py --example smollm2 --out runs/agent-smollm2     # SmolLM2, two-turn addition

The examples (``--example``): ``calc``, agent.toml with ``agent.py --task calc``;
``smollm2``, smollm2.toml (models/smollm2-135m, imported first) with ``agent.py --task
add2`` and 8 problems in flight. scripts/results.py runs both for docs/results.md
(records ``agent`` and ``agent_smollm2``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def tenth_means(xs: list[float]) -> tuple[float, float]:
    n = max(1, len(xs) // 10)
    return sum(xs[:n]) / n, sum(xs[-n:]) / n


EXAMPLES = {
    "calc": ("agent.toml", ["--task", "calc"], 4),
    "smollm2": ("smollm2.toml", ["--task", "add2"], 8),
}
"""--example -> (its config in this directory, the agent's task, its default --concurrency)."""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--example", choices=sorted(EXAMPLES), default="calc")
    p.add_argument("--out", default="runs/agent-measure")
    p.add_argument("--problems", type=int, default=400, help="the agent stops earlier, when the run ends")
    p.add_argument("--concurrency", type=int, help="problems in flight (calc: 4, smollm2: 8)")
    p.add_argument("--set", action="append", default=[], help="config overrides for afctl up")
    args = p.parse_args()
    config, task, concurrency = EXAMPLES[args.example]
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    run_dir = out / "run"
    sets = [x for s in args.set for x in ("--set", s)]
    up = subprocess.Popen(
        [sys.executable, "-m", "asyncflow.cli.main", "up", str(HERE / config), "--run-dir", str(run_dir), *sets],
        stdout=open(out / "afctl.log", "w"),
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    started = time.monotonic()
    pointer = run_dir / "gateway.json"
    while not pointer.exists():  # written by rollout.0 once its gateway listens
        if up.poll() is not None:
            raise SystemExit(f"afctl up exited ({up.returncode}) before the gateway served: {out / 'afctl.log'}")
        time.sleep(0.2)
    url = json.loads(pointer.read_text())["url"] + "/v1"
    log = out / "agent.jsonl"
    agent = subprocess.run(
        [sys.executable, str(HERE / "agent.py"), "--base-url", url, "--problems", str(args.problems), *task]
        + ["--concurrency", str(args.concurrency or concurrency), "--log", str(log)],
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # nothing of asyncflow in its process
    )
    code = up.wait()
    if code != 0:
        raise SystemExit(f"afctl up failed ({code}): {out / 'afctl.log'}")
    episodes = [json.loads(line) for line in log.read_text().splitlines()]
    rewards = [e["reward"] for e in episodes]
    first, last = tenth_means(rewards)
    # add2: the share of episodes right at the first turn (a second chance's 0.5 aside)
    right_at_once = tenth_means([float(e["turns"] == 1 and e["reward"] > 0) for e in episodes])
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "reward_mean" in s]
    t_first, t_last = tenth_means([s["reward_mean"] for s in steps])
    trained = [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    result = {
        "agent": {
            "episodes": len(rewards),
            "reward_first_10pct": round(first, 4),
            "reward_last_10pct": round(last, 4),
            "ratio": round(last / first, 2) if first else None,
            "agent_exit": agent.returncode,
            **(
                {
                    "first_turn_right_first_10pct": round(right_at_once[0], 4),
                    "first_turn_right_last_10pct": round(right_at_once[1], 4),
                }
                if args.example == "smollm2"
                else {}
            ),
        },
        "trainer": {
            "steps": len(steps),
            "sessions_trained": sum(len(t["indices"]) for t in trained),
            "sessions_stale": sum(len(t.get("stale_sessions", [])) for t in trained),
            "reward_first_10pct_steps": round(t_first, 4),
            "reward_last_10pct_steps": round(t_last, 4),
            "staleness_max": max(s.get("staleness_max", 0) for s in steps),
        },
        # the run's own account (summary.json): discarded fraction, staleness mean, an early end's reason
        "run": {
            k: summary.get(k) for k in ("sessions_trained", "sessions_stale", "sessions_stale_frac", "staleness_mean", "ended")
        },
        "wall_s": round(time.monotonic() - started),
        "load_avg_1m": round(os.getloadavg()[0], 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
