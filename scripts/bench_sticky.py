"""Prefix reuse with sticky and with round-robin routing over several gateway replicas.

``--replicas`` gateways, each with its own engine (a replica), in one process behind the
front (``gateway/front.py``); ``--sessions`` agents at once, each ``--turns`` turns of a
calculator chat through the OpenAI client. Routed ``sticky`` (a session's turns on one
replica: how a run routes) and ``round_robin`` (every request to the next replica:
only possible here, where the gateways share one session store; a run never routes so).
Each replica counts, of every turn's prompt tokens, those it had already run for the
session (``gateway/prefix.py``): what a per-replica prefix cache could reuse; and what
its native engine's prefix cache did serve (``gateway/prefix_cached_tokens``: whole
16-token blocks, also of other sessions' identical prefixes, such as the chat template's
system prompt: compute saved).

    PYTHONPATH=. python scripts/bench_sticky.py [--replicas 2,4] [--sessions 8] [--turns 4] [--tokens 16] [--json]

``--json``: the last line is one JSON object (``runs``: one per replica count and routing),
the ``sticky`` section of scripts/results.py (docs/results.md).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor


def run(policy: str, replicas: int, args, model_dir, tokenizer) -> dict:
    import openai

    from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
    from asyncflow.engines.factory import build_rollout_engine
    from asyncflow.gateway.front import Front
    from asyncflow.gateway.server import Gateway
    from asyncflow.gateway.sessions import SessionStore

    params = SamplingParams(max_new_tokens=args.tokens, stop_token_ids=(tokenizer.eos_token_id,))
    store = SessionStore(1024)  # shared: a session can be served by any replica (round robin)
    gateways = []
    for r in range(replicas):
        engine = build_rollout_engine(RolloutEngineConfig(max_batch_size=4, kv_cache_bytes=1 << 20, seed=r), model_dir)
        gateways.append(Gateway(engine, tokenizer, params, engine_lock=threading.Lock(), replica=r, sessions=store))
        gateways[-1].start("127.0.0.1", 0)
    front = Front(list(range(replicas)), lambda i: gateways[i].url, policy=policy)  # type: ignore[arg-type]
    api = openai.OpenAI(base_url=front.start("127.0.0.1", 0) + "/v1", api_key="unused", max_retries=0, timeout=120)

    def agent(k: int) -> None:
        chat: list[dict] = []
        for t in range(args.turns):
            chat.append({"role": "user", "content": f"{k + 3 * t}+{t + 7}="})
            r = api.chat.completions.create(model="m", messages=chat, user=f"{policy}-{k}")
            chat.append({"role": "assistant", "content": r.choices[0].message.content})

    try:
        with ThreadPoolExecutor(args.sessions) as pool:
            list(pool.map(agent, range(args.sessions)))
        stats = api.get("/asyncflow/stats", cast_to=object)
    finally:
        front.close()
        for gw in gateways:
            gw.close()
    total = stats["total"]
    prompt, reused, same = (
        total[k] for k in ("gateway/prompt_tokens", "gateway/prefix_reused_tokens", "gateway/prefix_reused_same_version_tokens")
    )
    return {
        "replicas": replicas,
        "policy": policy,
        "prompt_tokens": int(prompt),
        "reused_tokens": int(reused),
        "reused_fraction": reused / prompt,
        "reused_same_version_tokens": int(same),
        "cached_tokens": int(total.get("gateway/prefix_cached_tokens", 0)),
        "cached_fraction": total.get("gateway/prefix_cached_tokens", 0) / prompt,
        "per_replica_prompt_tokens": {r: int(c["gateway/prompt_tokens"]) for r, c in stats["replicas"].items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", default="2", help="replica counts, comma-separated (e.g. 2,4)")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    from asyncflow.engines.hf import load_tokenizer
    from asyncflow.toy.tiny import make_tiny_model

    torch.set_num_threads(1)
    model_dir = make_tiny_model(tempfile.mkdtemp(prefix="bench-sticky-"), seed=0)
    tokenizer = load_tokenizer(model_dir)
    counts = [int(n) for n in str(args.replicas).split(",")]
    results = [run(policy, n, args, model_dir, tokenizer) for n in counts for policy in ("sticky", "round_robin")]
    print(f"{args.sessions} sessions x {args.turns} turns (tiny model, {args.tokens}-token replies)")
    print(
        f"{'replicas':>8} {'routing':<12} {'prompt tokens':>14} {'reused':>8} {'reused %':>9} {'cached':>8} {'cached %':>9}  per replica"
    )
    for r in results:
        print(
            f"{r['replicas']:>8} {r['policy']:<12} {r['prompt_tokens']:>14} {r['reused_tokens']:>8} "
            f"{100 * r['reused_fraction']:>8.1f}% {r['cached_tokens']:>8} {100 * r['cached_fraction']:>8.1f}%  "
            f"{r['per_replica_prompt_tokens']}"
        )
    if args.json:
        print(json.dumps({"sessions": args.sessions, "turns": args.turns, "tokens": args.tokens, "runs": results}))


if __name__ == "__main__":
    main()
