"""Where a run's time goes: per role, per activity and phase, in ms per trainer step.

Read from RUN_DIR/trace.json (the roles' spans, ``actors/runtime/spans.py``; phases of an
activity, ``core/phases.py``, are the spans named ``<activity>/<phase>``). Pure
functions: ``afctl bench e2e --breakdown`` prints it, ``scripts/results.py`` puts it
in docs/performance.md, tests check it on a real run.

Per role: ``busy_ms`` (every non-``wait_*`` activity), ``wait_ms``, each activity and
each phase, all divided by the number of trainer steps; ``compute_ms`` is the part
spent in the model and the user's functions (``COMPUTE_PHASES``), ``framework_ms``
the rest of the busy time (queue hand-offs, padding, weight snapshots, Python
bookkeeping), ``eval_ms`` the held-out evaluation (a feature, neither).
``cpu_ms`` is the CPU the role's whole process used (every thread, from the
start of its work to its last report): on a machine whose cores the roles share,
that, not wall time, is what one role takes from the others.
"""

from __future__ import annotations

COMPUTE_PHASES = frozenset(
    {
        "forward",
        "loss",
        "backward",
        "optimizer",
        "prox_logp",  # trainer (engines/torch_train.py, actors/trainer/policy.py)
        "prefill_model",
        "decode_model",
        "sample",  # rollout (engines/native_rollout.py)
        "reward_fn",  # reward: the configured functions
    }
)
"""Phases that are the work itself; any other busy time is the framework's share."""

EVAL_ACTIVITIES = frozenset({"eval"})


def breakdown(trace: dict, num_steps: int) -> dict[str, dict]:
    """``{role: {"busy_ms", "wait_ms", "compute_ms", "framework_ms", "eval_ms",
    "activities": {name: ms}, "phases": {"activity/phase": ms}}}``, per trainer step."""
    events = trace["traceEvents"]
    names = {
        e["pid"]: e["args"]["name"].split(" (pid")[0] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    per = max(num_steps, 1)
    out: dict[str, dict] = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        role = out.setdefault(names.get(e["pid"], f"track {e['pid']}"), {"activities": {}, "phases": {}})
        kind = "phases" if e.get("cat") == "phase" else "activities"
        role[kind][e["name"]] = role[kind].get(e["name"], 0.0) + e["dur"] / 1e3 / per
    cpu: dict[str, list[float]] = {}
    for e in events:
        if e.get("ph") == "C" and e.get("name") == "cpu":
            cpu.setdefault(names.get(e["pid"], f"track {e['pid']}"), []).append(e["args"]["cpu_s"])
    for name, role in out.items():
        samples = cpu.get(name, [])
        role["cpu_ms"] = 1e3 * (max(samples) - min(samples)) / per if len(samples) > 1 else 0.0
    for role in out.values():
        acts, phases = role["activities"], role["phases"]
        role["busy_ms"] = sum(ms for name, ms in acts.items() if not name.startswith("wait_"))
        role["wait_ms"] = sum(ms for name, ms in acts.items() if name.startswith("wait_"))
        role["eval_ms"] = sum(ms for name, ms in acts.items() if name in EVAL_ACTIVITIES)
        role["compute_ms"] = sum(
            ms
            for name, ms in phases.items()
            if name.split("/")[-1] in COMPUTE_PHASES and name.split("/")[0] not in EVAL_ACTIVITIES
        )
        role["framework_ms"] = role["busy_ms"] - role["eval_ms"] - role["compute_ms"]
        role["activities"] = dict(sorted(acts.items(), key=lambda kv: -kv[1]))
        role["phases"] = dict(sorted(phases.items(), key=lambda kv: -kv[1]))
    return dict(sorted(out.items()))


def rounded(b: dict[str, dict], digits: int = 2) -> dict[str, dict]:
    """The same, every figure rounded (for JSON lines)."""
    return {
        role: {
            k: ({n: round(v, digits) for n, v in x.items()} if isinstance(x, dict) else round(x, digits)) for k, x in r.items()
        }
        for role, r in b.items()
    }


def table(by_run: dict[str, dict[str, dict]]) -> list[str]:
    """Side-by-side lines (one column per run: "sync", "async") of every role's totals,
    activities and phases (indented under their activity), ms per step."""
    runs = list(by_run)
    roles = sorted({role for b in by_run.values() for role in b})
    head = f"{'ms per trainer step':<40}" + "".join(f"{r:>12}" for r in runs)
    lines = [head, "-" * len(head)]

    def row(label: str, get) -> str:
        cells = []
        for r in runs:
            v = get(by_run[r])
            cells.append(f"{v:>12.2f}" if v is not None else f"{'-':>12}")
        return f"{label:<40}" + "".join(cells)

    for role in roles:

        def pick(b, *keys, role=role):
            x = b.get(role)
            for k in keys:
                if x is None:
                    return None
                x = x.get(k)
            return x

        lines.append(f"{role}")
        for key in ("busy_ms", "compute_ms", "framework_ms", "eval_ms", "wait_ms", "cpu_ms"):
            lines.append(row(f"  {key.removesuffix('_ms')}", lambda b, key=key: pick(b, key)))
        acts = sorted(
            {a for b in by_run.values() for a in (b.get(role) or {}).get("activities", {})},
            key=lambda a: (
                a.startswith("wait_"),
                -max((by_run[r].get(role) or {}).get("activities", {}).get(a, 0.0) for r in runs),
            ),
        )
        for act in acts:
            lines.append(row(f"    {act}", lambda b, act=act: pick(b, "activities", act)))
            subs = sorted({p for b in by_run.values() for p in (b.get(role) or {}).get("phases", {}) if p.split("/")[0] == act})
            for sub in subs:
                lines.append(row(f"      {sub.split('/', 1)[1]}", lambda b, sub=sub: pick(b, "phases", sub)))
    return lines
