"""docs/performance.md from the JSON lines ``scripts/results.py`` keeps (sections
breakdown, peer, ab, ab_round2, ab_round3, ab_prefetch, ab_placement, ab_pin, ab_call, and parity when kept: the learning check of the same
code). Every figure comes from those lines."""

from __future__ import annotations

BIG_MS = 0.3  # activities and phases below this many ms per step (in both modes) are left out of the tables


def _load(r: dict) -> str:
    return f"load average {r['load_avg_1m']} at the end"


def _pinned(x: dict) -> str:
    """In how many rounds the run pinned the trainer's core (cluster.pin_trainer_cores, applied only on an idle machine)."""
    rounds = x.get("pinned_trainer_cores_rounds")
    if rounds is None:
        return ""
    return f"; trainer's core pinned in {sum(1 for n in rounds if n)} of {len(rounds)} rounds"


def _peer(r: dict) -> list[str]:
    p = r["result"]
    s = p["systems"]
    out = [
        "## Against the trainer a user would otherwise pick",
        "",
        f"`{r['command']}` ({r['when']}, {_load(r)}): TRL's `GRPOTrainer` (the `bench` extra), then asyncflow "
        f"sync, then asyncflow async (`examples/local.toml` as shipped), one after the other on the same "
        f"warm-started model, data, reward, {p['samples_per_step']} samples per step, {p['steps']} steps. "
        "Samples/s counts training time only; no evaluation or checkpoints on either side."
        + (
            f" {p['rounds']} rounds, one after the other (TRL, sync, async, TRL...): each samples/s is the median over "
            "the rounds (every round's in brackets), each ratio the median of the rounds' ratios."
            if p.get("rounds", 1) > 1
            else ""
        ),
        "",
        "| system | samples/s | vs TRL | last-10% reward |",
        "|---|---|---|---|",
    ]
    trl = s.get("trl", {}).get("samples_per_s")
    for name, label in (
        ("trl", f"TRL GRPOTrainer (torch threads: {s.get('trl', {}).get('threads', '?')})"),
        ("sync", "asyncflow sync"),
        ("async", f"asyncflow async (k = {s['async'].get('staleness')}{_pinned(s['async'])})"),
    ):
        if name in s:
            x = s[name]
            ratio = "-"
            if name == "trl":
                ratio = "1.00x"
            elif trl:
                ratio = f"{p.get(f'{name}_over_trl', x['samples_per_s'] / trl):.2f}x"
                if len(p.get(f"{name}_over_trl_rounds", [])) > 1:
                    ratio += " (" + ", ".join(f"{v:.2f}" for v in p[f"{name}_over_trl_rounds"]) + ")"
            figure = f"{x['samples_per_s']:.0f}"
            if len(x.get("samples_per_s_rounds", [])) > 1:
                figure += " (" + ", ".join(f"{v:.0f}" for v in x["samples_per_s_rounds"]) + ")"
            out.append(f"| {label} | {figure} | {ratio} | {x['reward_last_10pct']:.3f} |")
    if trl:
        out += [
            "",
            f"Targets of issue 13: sync >= 1.1x TRL (measured {p['sync_over_trl']:.2f}x), async >= 1.6x TRL "
            f"(measured {p['async_over_trl']:.2f}x) with a last-10% reward at least TRL's (async "
            f"{s['async']['reward_last_10pct']:.3f}, TRL {s['trl']['reward_last_10pct']:.3f}).",
        ]
    return out + [""]


def _breakdown(r: dict, title: str = "## Where a step's time goes", what: str = "") -> list[str]:
    e = r["result"]
    b = e["breakdown"]
    out = [
        title,
        "",
        f"`{r['command']}` ({r['when']}, {_load(r)}){what}. Sync {e['sync_ms_per_step']:.1f} ms per step, async "
        f"{e['async_ms_per_step']:.1f} ms (k = 1; {e['async_samples_per_s'] / e['sync_samples_per_s']:.2f}x; "
        f"async pipeline efficiency {e['async_pipeline_efficiency']:.2f}).",
        "",
        "Per role, in ms per trainer step: **busy** (every activity but `wait_*`), of which **compute** (the "
        "model's forward, backward, optimizer step, decode and sampling, and the reward functions) and "
        "**framework** (everything else: queue hand-offs, padding, weight snapshots, bookkeeping), **eval** "
        "(held-out evaluation), **wait** (idle), and **cpu**: the CPU time of the role's whole process from "
        "the start of its work to its last report, which also holds what no activity covers (its other "
        "threads: the trainer's weight staging and message listeners; the trainer's final checkpoint). Busy "
        "wall time above cpu is time the role was blocked on a round trip or waiting for a core.",
        "",
        "| role | busy | compute | framework | eval | wait | cpu |",
        "|---|---|---|---|---|---|---|",
    ]
    for role in sorted(set(b["sync"]) | set(b["async"])):
        cells = []
        for key in ("busy_ms", "compute_ms", "framework_ms", "eval_ms", "wait_ms", "cpu_ms"):
            cells.append(" / ".join(f"{b[m].get(role, {}).get(key, 0.0):.1f}" for m in ("sync", "async")))
        out.append(f"| {role} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Each cell is sync / async. The activities and their phases (`activity/phase`), ms per step, those "
        f"of at least {BIG_MS} ms in either mode:",
        "",
        "| role | activity or phase | sync | async |",
        "|---|---|---|---|",
    ]
    for role in sorted(set(b["sync"]) | set(b["async"])):
        names = set()
        for m in ("sync", "async"):
            x = b[m].get(role, {})
            names |= set(x.get("activities", {})) | set(x.get("phases", {}))

        def ms(m, name, role=role):
            x = b[m].get(role, {})
            return x.get("phases" if "/" in name else "activities", {}).get(name, 0.0)

        for name in sorted(names, key=lambda n: (n.split("/")[0].startswith("wait_"), n.split("/")[0], "/" in n, n)):
            if max(ms("sync", name), ms("async", name)) >= BIG_MS:
                out.append(
                    f"| {role} | {'&nbsp;&nbsp;' if '/' in name else ''}{name} | {ms('sync', name):.2f} | "
                    f"{ms('async', name):.2f} |"
                )
    return out + [""]


def _real_breakdown(r: dict, rollout: dict | None, train: dict | None) -> list[str]:
    """A step of the real model (SmolLM2-135M, examples/smollm2.toml), role by role, then the operators of its
    two hot loops from docs/real-model.md's sections (the rollout's profile; training float32 against autocast)."""
    from real_model_page import _profile, _rollout_line, _train

    out = _breakdown(
        r,
        "## At real size: a step of SmolLM2-135M",
        ": `examples/smollm2.toml` (8 prompts x 8 samples, 16 new tokens, the trainer under bfloat16 autocast), no "
        "held-out evaluation, the first step (the warm-up) included",
    )
    out += [
        "The rollout and the trainer are nearly all compute here: the framework's share (queue hand-offs, "
        "snapshots, bookkeeping) is the same few ms per step as with the tiny model, against seconds of "
        "matmuls. The two loops' operators:",
        "",
    ]
    if rollout is not None:
        x = rollout["result"]
        prof = x.get("profile_s") or {}
        out += [
            "### Generation (the native engine against HF generate)",
            "",
            _rollout_line(rollout),
            "",
            *_profile(prof, x["baseline"]),
        ]
        if prof:
            share = prof["native"]["matmul"] / prof["native"]["wall_s"]
            out += [
                f"Matmuls are {share:.0%} of the native engine's wall time. Per token, the LM head over the 49,152 "
                "entries is 576 x 49,152 = 28.3 M multiply-adds and one of the 30 layers 3.54 M (q and o 576 x 576, "
                "k and v 576 x 192, the MLP 3 x 576 x 1,536): the head is as much as 8 layers, 21% of a token's "
                "matmul work. The KV cache is a paged pool allocated once (blocks of 16 token slots per layer, "
                "`engines/kv_cache.py`), gathered with `index_select` (`kv_cache` above). In bfloat16 "
                "(`rollout.engine.dtype`): docs/real-model.md, 'In bfloat16'.",
                "",
            ]
    if train is not None:
        out += ["### Training: float32 against bfloat16 matmuls", "", *_train(train)[2:]]
        out += [
            "The LM head stays in float32 under autocast (bfloat16 logits put ~0.1 of error into a token's "
            "log-prob, which the importance ratio would read as off-policy); the decoder's matmuls run in "
            "bfloat16 with float32 accumulation (`avx512_bf16`).",
            "",
        ]
    return out


def _ab(r: dict, title: str, what: str) -> list[str]:
    a = r["result"]["ab"]
    bef, aft = a["before"], a["after"]
    rounds = (
        f"{a['rounds']} rounds interleaved (before, after, before, after...)"
        if a["rounds"] > 1
        else "one round (before, then after)"
    )
    out = [
        f"## {title}",
        "",
        f"`{r['command']}` ({r['when']}): {what} `bench e2e` of each, "
        f"{rounds}, {a['steps']} steps per mode; load average after each run: "
        f"{', '.join(str(x) for x in a['load_avg_1m'])}.",
        "",
        "| | before | after | after / before |",
        "|---|---|---|---|",
    ]
    for key, label in (("sync_samples_per_s", "sync samples/s"), ("async_samples_per_s", "async samples/s")):
        out.append(f"| {label} | {bef[key]:.0f} | {aft[key]:.0f} | {aft[key] / bef[key]:.2f}x |")
    out.append(
        f"| async pipeline efficiency | {bef['async_pipeline_efficiency']:.2f} | {aft['async_pipeline_efficiency']:.2f} | |"
    )
    if "queue_round_trip_ms" in aft:  # --queue-rounds: each tree's `afctl bench queue` in every round
        x, y = bef["queue_round_trip_ms"], aft["queue_round_trip_ms"]
        out.append(f"| `bench queue` round trip, ms (median) | {x:.3f} | {y:.3f} | {y / x:.2f}x |")
        x, y = bef["queue_samples_per_s"], aft["queue_samples_per_s"]
        out.append(f"| `bench queue` rows/s | {x:.0f} | {y:.0f} | {y / x:.2f}x |")
    if any("queue_samples_per_s" in e for e in aft.get("each", [])):  # the rounds one by one: their spread

        def rounds(tree: dict, key: str, fmt: str) -> str:
            return ", ".join(format(e[key], fmt) for e in tree["each"])

        out.append(
            f"| each round: sync samples/s | {rounds(bef, 'sync_samples_per_s', '.0f')} | "
            f"{rounds(aft, 'sync_samples_per_s', '.0f')} | |"
        )
        out.append(
            f"| each round: async samples/s | {rounds(bef, 'async_samples_per_s', '.0f')} | "
            f"{rounds(aft, 'async_samples_per_s', '.0f')} | |"
        )
        out.append(
            f"| each round: `bench queue` rows/s | {rounds(bef, 'queue_samples_per_s', '.0f')} | "
            f"{rounds(aft, 'queue_samples_per_s', '.0f')} | |"
        )
    for mode in ("sync", "async"):
        for role in sorted(aft[f"{mode}_busy_ms"]):
            x, y = bef[f"{mode}_busy_ms"].get(role, 0.0), aft[f"{mode}_busy_ms"][role]
            out.append(f"| {mode}: {role} busy ms/step | {x:.1f} | {y:.1f} | |")
    if "sync_activities_ms" in aft and "sync_activities_ms" in bef:
        out += [
            "",
            "Activities, ms per step (mean of the rounds; those of at least "
            f"{BIG_MS} ms in either tree; an activity absent from one tree was not recorded there):",
            "",
            "| mode | role | activity | before | after |",
            "|---|---|---|---|---|",
        ]
        for mode in ("sync", "async"):
            for role in sorted(aft[f"{mode}_activities_ms"]):
                x, y = bef[f"{mode}_activities_ms"].get(role, {}), aft[f"{mode}_activities_ms"][role]
                for name in sorted(set(x) | set(y)):
                    if not name.startswith("wait_") and max(x.get(name, 0.0), y.get(name, 0.0)) >= BIG_MS:

                        def cell(d, name=name):
                            return f"{d[name]:.2f}" if name in d else "-"

                        out.append(f"| {mode} | {role} | {name} | {cell(x)} | {cell(y)} |")
    return out + [""]


SECTIONS = (
    "peer",
    "breakdown",
    "real_breakdown",
    "ab",
    "ab_round2",
    "ab_round3",
    "ab_prefetch",
    "ab_placement",
    "ab_pin",
    "ab_call",
    "ab_seams",
    "micro",
    "changes",
    "parity",
)
"""The page's sections in order; each is between ``<!-- section: NAME -->`` markers, and one without a JSON
line keeps its text from the page as it stands (``changes`` is text, rendered every time)."""
ROUNDS = {  # each round of issue 13 against the code before it (its own examples/local.toml)
    "ab": ("Before and after, side by side", "the code before this work"),
    "ab_round2": ("Second round: before and after, side by side", "the code before the second round"),
    "ab_round3": ("Third round: before and after, side by side", "the code before the third round"),
    "ab_seams": (
        "The seams refactor (issue 32): before and after, side by side",
        "the code before the seams refactor (the rollout package, the algorithm registry, role facts on the specs, "
        "the driver's lifecycle, the config split)",
    ),
}


def render_performance(records: dict[str, dict], previous: str = "") -> str:
    """The page from ``records`` (JSON lines by section name; real_breakdown's page section also reads
    real_rollout's and real_train's when kept) and, for the sections without one, ``previous``."""
    from real_model_page import previous_sections

    out = [
        "# Performance: the framework's own cost per step (issue 13)",
        "",
        "Written by `python scripts/results.py --only breakdown peer ab ab_round2 ab_round3 ab_prefetch ab_placement ab_pin ab_call "
        "ab_seams micro` (and `real_breakdown`, with the real model: docs/real-model.md) from the JSON line of each command "
        "below; do not edit by hand. The machine: 2 cores, no accelerator, shared with other jobs (the load "
        "average is given with each figure), so absolute figures move between runs; the ratios measured side "
        "by side in one invocation are the ones to trust.",
        "",
    ]
    kept = previous_sections(previous)
    for name in SECTIONS:
        if name == "changes":
            lines = _changes()
        elif name in records:
            lines = _section(name, records)
        elif name in kept:
            lines = kept[name].rstrip("\n").split("\n") + [""]
        else:
            continue
        out += [f"<!-- section: {name} -->", *lines, f"<!-- end: {name} -->"]
    return "\n".join(out)


def _section(name: str, records: dict[str, dict]) -> list[str]:
    r = records[name]
    if name == "peer":
        return _peer(r)
    if name == "breakdown":
        return _breakdown(r)
    if name == "real_breakdown":
        return _real_breakdown(r, records.get("real_rollout"), records.get("real_train"))
    if name in ROUNDS:
        title, before = ROUNDS[name]
        rev = r["result"]["ab"].get("before_rev")
        return _ab(r, title, f"{before} (`{rev}`, its own `examples/local.toml`) and after it, the")
    if name == "parity":
        return _parity(r)
    if name == "micro":
        return _micro(r)
    return _AB_ALONE[name](r)


def _ab_prefetch(r: dict) -> list[str]:
    out: list[str] = []
    out += _ab(
        r,
        "The trainer's next request sent while it trains",
        "this code with `workflow.prefetch_batch = false` (before) and `true` (after, as shipped), the",
    )
    return out


def _ab_placement(r: dict) -> list[str]:
    out: list[str] = []
    out += _ab(
        r,
        "Rewards scored in the rollout replica",
        'this code with `reward.placement = "role"` (before: a reward process) and `"rollout"` (after, '
        "`examples/local.toml` as shipped), the",
    )
    out += [
        '`reward.placement = "rollout"` suits cheap rule-based functions such as the tiny task\'s: a slow '
        'function would hold generation back, so the config default stays `"role"` (its own processes, '
        "`reward.num_workers` of them).",
        "",
    ]
    return out


def _ab_pin(r: dict) -> list[str]:
    out: list[str] = []
    out += _ab(
        r,
        "Pinning the trainer to its own core",
        "this code with `cluster.pin_trainer_cores = 0` (before) and `= 1` (after, `examples/local.toml` as shipped), the",
    )
    out += [
        "Pinning is meant for a machine the run has to itself (the trainer, an async step's critical path, "
        "then never waits for a core). Where other jobs load both cores it can hurt (the trainer is held to "
        "one busy core while the other may be free), so it applies only where the cores were nearly idle as "
        "the run started (`cluster.pin_only_when_idle`, default true, `actors/driver/_pinning.py`); each run prints "
        "its decision and records it in summary.json (`pinned_trainer_cores`).",
        "",
    ]
    return out


def _ab_call(r: dict) -> list[str]:
    out: list[str] = []
    out += _ab(
        r,
        "A whole step per generate call",
        "this code with `rollout.prompts_per_call = 8`, `rollout.engine.max_batch_size = 64` (before, the "
        "previous example) and `16`, `128` (after, as shipped), the",
    )
    return out


def _micro(r: dict) -> list[str]:
    out: list[str] = []
    m = r["result"]["micro"]
    labels = {
        "token_batch": "`token_batch`, 128 rows (trainer)",
        "generate": "native engine `generate`, 16 prompts x 8 samples (rollout; same completions)",
        "forward_backward_mask": "training forward + backward, with the mask (old) / without (new)",
        "adamw_step": "AdamW step, default (old) / fused (new)",
    }
    out += [
        "## Each change on its own, old code against new",
        "",
        f"`{r['command']}` ({r['when']}, {_load(r)}): one process, one thread, best of the alternated rounds.",
        "",
        "| what | old ms | new ms | old / new |",
        "|---|---|---|---|",
    ]
    out += [f"| {labels.get(k, k)} | {v['old_ms']:.3f} | {v['new_ms']:.3f} | {v['ratio']:.2f}x |" for k, v in m.items()]
    out.append("")
    return out


def _changes() -> list[str]:
    out: list[str] = []
    out += [
        "## What changed, and why it is exact",
        "",
        "- `actors/_batching.token_batch`: one concatenation and scatter per column instead of per-row tensor "
        "writes (the same tensors; `tests/bench/test_token_batch_vectorised.py`).",
        "- Training engine: a right-padded batch trains without the attention mask (causal attention alone "
        "never lets a real token see a pad: the same logits up to float rounding); fused AdamW on cpu/cuda.",
        "- Trainer: the weights are handed to `weights` without waiting for it to stage them and tell the "
        "replicas (cached replica addresses, a fresh lookup only when a tell fails); a step's rows are acked "
        "inside the next step's GetBatch (flushed before a checkpoint saves the queue).",
        "- Native rollout engine: the slot table and the prefill batch are built with one scatter each "
        "(identical completions for a seed).",
        "- Native rollout engine: the samples of a prompt share one prefill: the first runs it, the others copy "
        "its prompt KV and last logits, and each still samples its own first token from one `sample` call over "
        "all of them (identical completions for a seed; `generate/prefill_share` in the breakdown).",
        "- Rollout weight swap: the fetch takes the announced `WeightsReady` instead of asking for the latest; "
        "the staged digest is the one the trainer published (the swap still checks the engine's weights against "
        "it); in sync no swap lock, and an announced version is waited for without asking the queue first.",
        "- Reward (async): once it waited for a put, it takes every row that put made ready: one score and "
        "one put per rollout put instead of two.",
        "- Second round. Trainer: the request for step s + 1's rows goes out from a thread while step s "
        "trains (`actors/trainer/_prefetch.py`, `workflow.prefetch_batch`): the same rows with the same metadata, only "
        "asked for earlier; step s's rows are acked one request later. Rollout: the rows of the newest "
        "announced version are asked for while its weights are still being fetched, and generated only once "
        "they are swapped in (`WeightInbox.swap_to`, actors/rollout/inbox.py): the same admission rule, and a gated async replica no "
        'longer asks the queue twice per step. `reward.placement = "rollout"`: the same functions on the '
        "same decoded rows (`actors/runtime/scoring.py`), called in the replica; one process, one hand-off and one "
        "put less per batch.",
        "- Third round. The driver closes its client sockets to a finished run's actors: a cached nng dialer "
        "to an address nobody listens on redialled it forever, about 8% of a core in an idle driver after one "
        "run, so every later run of the same process (the async half of `bench e2e` and `bench peer`, which "
        "run sync first) was slower. A replica the new version was announced to alone swaps without the swap "
        "grant (`AcquireSwap`/`ReleaseSwap`: two round trips per step on the rollout's path); the trainer's "
        "step metrics go out from a sender thread instead of a round trip to the driver, and trained.jsonl "
        "stays open. `[cluster] pin_trainer_cores = 1` in `examples/local.toml`: the trainer gets a core to "
        "itself where the machine is idle as the run starts (`cluster.pin_only_when_idle`).",
        "- `examples/local.toml`: a whole step's 16 prompt groups per generate call, decoded as one batch of "
        "128 (half the model forwards of 8 groups in batches of 64).",
        "- `afctl bench e2e --breakdown` and the `core/phases.py` spans it reads; `afctl bench peer`; "
        "`scripts/ab_e2e.py` (before/after of whole runs); `scripts/perf_micro.py` (each change alone).",
        "",
        "",
    ]
    return out


_AB_ALONE = {"ab_prefetch": _ab_prefetch, "ab_placement": _ab_placement, "ab_pin": _ab_pin, "ab_call": _ab_call}


def _parity(r: dict) -> list[str]:
    p = r["result"]["parity"]
    s, a = p["sync"], p["async"]
    out = [
        "## Learning is unchanged",
        "",
        f"`{r['command']}` ({r['when']}, {_load(r)}): `examples/local.toml` as shipped, with every change "
        "above, each run a fresh `afctl up`.",
        "",
        "| seed | sync last-10% reward | async last-10% reward | sync samples/s | async samples/s |",
        "|---|---|---|---|---|",
    ]
    for i, seed in enumerate(p["seeds"]):
        out.append(
            f"| {seed} | {s['reward_last_10pct'][i]:.3f} | {a['reward_last_10pct'][i]:.3f} | "
            f"{s['samples_per_s'][i]:.0f} | {a['samples_per_s'][i]:.0f} |"
        )
    out += [
        "",
        f"Means: **sync {s['reward_last_10pct_mean']:.3f}, async {a['reward_last_10pct_mean']:.3f}** "
        f"(async - sync = {p['async_minus_sync']:+.3f}; the bound is 0.03, and async at least 0.55).",
        "",
    ]
    return out
