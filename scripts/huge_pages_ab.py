"""Transparent huge pages for torch's CPU allocations off vs on, interleaved.

torch's CPU allocator asks for 2 MB pages (``madvise(MADV_HUGEPAGE)``) for tensors of
2 MB or more when the environment variable ``THP_MEM_ALLOC_ENABLE`` is 1, read once per
process; asyncflow sets nothing: its worker processes (and bench peer's TRL) inherit
the environment of ``afctl``, so a user turns it on with ``THP_MEM_ALLOC_ENABLE=1 afctl
up ...``. Each side runs in processes of its own: ``afctl bench train`` and ``afctl
bench rollout`` on SmolLM2, and a whole async run of ``examples/smollm2.toml``
(``afctl bench peer --skip-trl --skip-sync``), with the variable 0 and 1, off, on, off, on...
for ``--rounds`` rounds, so load changes on a shared machine hit both alike. Prints
the median of each figure per side, on/off ratios, the page faults of each side
(``/proc/vmstat`` pgfault over its runs) and one JSON line. About 20 minutes here.

    python scripts/huge_pages_ab.py --rounds 2 --run-steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENV = "THP_MEM_ALLOC_ENABLE"
"""The variable torch's CPU allocator (c10 ``alloc_cpu``) reads."""
MODEL = "models/smollm2-135m"
AFCTL = [sys.executable, "-m", "asyncflow.cli.main"]


def kernel_mode(path: Path = Path("/sys/kernel/mm/transparent_hugepage/enabled")) -> str:
    """The kernel's THP mode, the bracketed word of ``path`` ("unknown" without it). Only
    ``madvise`` tells the two sides apart: ``always`` gives both huge pages, ``never`` neither."""
    try:
        text = path.read_text()
    except OSError:
        return "unknown"
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else "unknown"


def faults() -> int:
    """Page faults of the whole machine so far (/proc/vmstat pgfault)."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("pgfault "):
            return int(line.split()[1])
    return 0


def last_json(cmd: list[str], env: dict[str, str]) -> tuple[dict, int, float]:
    """Run ``cmd``; its last output line as JSON, the page faults and seconds it took."""
    before, t0 = faults(), time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), faults() - before, time.monotonic() - t0


def benches(run_steps: int, out: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """name -> (its command, without the side's setting; the figures to keep, {label: JSON key}).

    The trainer's step and the rollout's call in examples/smollm2.toml's shapes (scripts/results.py's
    real_share_prompts and real_rollout), and a whole async run of the example."""
    train = [*AFCTL, "bench", "train", "--model", MODEL, "--share-prompts", "--num-rows", "64", "--group-size", "8"]
    train += ["--prompt-len", "46", "--seq-len", "62", "--micro-batch-size", "16", "--autocast", "--threads", "2"]
    train += ["--steps", "3", "--json"]
    rollout = [*AFCTL, "bench", "rollout", "--model", MODEL, "--num-prompts", "8", "--samples-per-prompt", "8"]
    rollout += ["--batch-size", "64", "--max-new-tokens", "24", "--repeats", "2", "--json"]
    cmds = {
        "train": (
            train,
            {
                "trainer tokens/s, every row whole": "whole_tokens_per_s",
                "trainer tokens/s, shared prompts": "shared_tokens_per_s",
            },
        ),
        "rollout": (rollout, {"native rollout tokens/s": "tokens_per_s", "HF generate tokens/s": "baseline_tokens_per_s"}),
    }
    if run_steps:  # async alone (bench peer without TRL and sync), no evaluation
        run = [*AFCTL, "bench", "peer", "--config", "examples/smollm2.toml", "--steps", str(run_steps), "--skip-trl"]
        run += ["--skip-sync", "--set", "eval.every_steps=0", "--set", "eval.at_start=false", "--json", "--out"]
        cmds["run"] = ([*run, str(out / "run")], {"async run samples/s": "samples_per_s"})
    return cmds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--run-steps", type=int, default=4, help="Steps of each whole async run (0: none).")
    ap.add_argument("--out", default="runs/huge_pages_ab")
    ap.add_argument("--json", action="store_true", help="Print one JSON object as the last line.")
    args = ap.parse_args()
    if not (ROOT / MODEL / "config.json").is_file():
        sys.exit(f"{MODEL} is missing: afctl model import-gguf smollm2 {MODEL} (README.md, 'A real model')")
    out = Path(args.out)
    base_env = {k: v for k, v in os.environ.items() if k != ENV}
    figures: dict[str, dict[str, list[float]]] = {"off": {}, "on": {}}
    page_faults = {"off": 0, "on": 0}
    seconds = {"off": 0.0, "on": 0.0}
    for r in range(args.rounds):
        for side in ("off", "on"):
            for name, (cmd, keys) in benches(args.run_steps, out / f"{side}-{r}").items():
                env = {**base_env, ENV: "1" if side == "on" else "0"}  # every process of a run inherits it
                print(f"== round {r + 1}/{args.rounds}, huge pages {side}: {name}", flush=True)
                line, n, s = last_json(cmd, env)
                line = line["systems"]["async"] if name == "run" else line
                page_faults[side] += n
                seconds[side] += s
                for label, key in keys.items():
                    figures[side].setdefault(label, []).append(float(line[key]))
    result: dict = {"kernel_mode": kernel_mode(), "rounds": args.rounds, "run_steps": args.run_steps, "figures": {}}
    print(f"\nkernel THP mode: {result['kernel_mode']}; medians over {args.rounds} round(s)")
    print(f"{'':<32}{'off':>10}{'on':>10}{'on/off':>9}")
    for label in figures["off"]:
        off, on = statistics.median(figures["off"][label]), statistics.median(figures["on"][label])
        result["figures"][label] = {"off": off, "on": on, "ratio": on / off, "off_runs": figures["off"][label]}
        result["figures"][label]["on_runs"] = figures["on"][label]
        print(f"{label:<32}{off:>10.2f}{on:>10.2f}{on / off:>8.2f}x")
    result["page_faults"] = page_faults
    result["seconds"] = seconds
    print(f"page faults (the machine's, over each side's runs): off {page_faults['off']:,}, on {page_faults['on']:,}")
    print(f"wall time of each side's runs: off {seconds['off']:.0f} s, on {seconds['on']:.0f} s")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
