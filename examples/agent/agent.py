"""An agent written without asyncflow: a plain OpenAI-client program that multiplies
two-digit numbers with a calculator tool, against any OpenAI-compatible endpoint.

Each episode: ask "37*48="; if the model answers with a tool call ``<calc>EXPR</calc>``,
run the calculator and send its result back as a ``tool`` message, then take the
model's next answer as final. Reward 1 for the exact product, else 0, posted to the
asyncflow gateway's reward route (docs/gateway.md). Episodes of one problem share a
group key (the ``X-Group-Id`` header): asyncflow trains them as one GRPO group.

    python examples/agent/agent.py --base-url http://127.0.0.1:8000/v1 --problems 120 --attempts 8

Nothing here imports asyncflow: point ``--base-url`` at a run's gateway
(RUN_DIR/gateway.json has the URL) and the run trains on what this program does.
One JSON line per finished episode goes to ``--log`` (its reward, in finishing order).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import operator
import random
import re
import sys
import time

import openai

CALL = re.compile(r"<calc>(.*?)</calc>")
OPS = {ast.Mult: operator.mul, ast.Add: operator.add, ast.Sub: operator.sub}


def calculator(expr: str) -> str:
    """+, - and * of integers; anything else is an error message the model sees."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise ValueError(expr)

    try:
        return str(ev(ast.parse(expr, mode="eval").body))
    except (SyntaxError, ValueError, RecursionError):
        return "error"


async def episode(api: openai.AsyncOpenAI, session: str, group: str, a: int, b: int, max_turns: int) -> float:
    chat: list[dict] = [{"role": "user", "content": f"{a}*{b}="}]
    answer = ""
    for _ in range(max_turns):
        r = await api.chat.completions.create(
            model="policy", messages=chat, user=session, max_tokens=24, extra_headers={"X-Group-Id": group}
        )
        answer = r.choices[0].message.content or ""
        chat.append({"role": "assistant", "content": answer})
        call = CALL.search(answer)
        if call is None:
            break
        chat.append({"role": "tool", "content": calculator(call.group(1))})
    reward = 1.0 if answer.strip() == str(a * b) else 0.0
    await api.post(f"/asyncflow/sessions/{session}/reward", body={"reward": reward}, cast_to=object)
    return reward


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key", default="unused")
    p.add_argument("--problems", type=int, default=120, help="problems to solve (each --attempts times)")
    p.add_argument("--attempts", type=int, default=8, help="episodes per problem, one group")
    p.add_argument("--concurrency", type=int, default=4, help="problems in flight at once")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", default="-", help="one JSON line per finished episode ('-': stdout)")
    args = p.parse_args()
    api = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=8, timeout=120)
    rng = random.Random(args.seed)
    problems = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(args.problems)]
    out = sys.stdout if args.log == "-" else open(args.log, "a")
    sem = asyncio.Semaphore(args.concurrency)
    stopped = asyncio.Event()

    async def solve(k: int, a: int, b: int) -> None:
        async with sem:
            if stopped.is_set():
                return
            group = f"p{args.seed}-{k}"
            try:
                rewards = await asyncio.gather(
                    *(episode(api, f"{group}-{j}", group, a, b, args.max_turns) for j in range(args.attempts))
                )
            except (openai.APIConnectionError, openai.APIStatusError) as exc:  # the run ended (or refused): stop
                stopped.set()
                print(f"agent: stopping at problem {k}: {exc}", file=sys.stderr)
                return
            for j, r in enumerate(rewards):
                out.write(json.dumps({"problem": k, "attempt": j, "reward": r, "t": time.time()}) + "\n")
            out.flush()

    await asyncio.gather(*(solve(k, a, b) for k, (a, b) in enumerate(problems)))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
