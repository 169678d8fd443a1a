"""An agent written without asyncflow: a plain OpenAI-client program, against any
OpenAI-compatible endpoint, with one of two tasks (``--task``):

- ``calc`` (the default; the tiny model of ``agent.toml``): multiply two-digit numbers
  with a calculator tool. Each episode: ask "37*48="; if the model answers with a tool
  call ``<calc>EXPR</calc>``, run the calculator and send its result back as a ``tool``
  message, then take the model's next answer as final. Reward 1 for the exact product,
  else 0.
- ``add2`` (a chat model, SmolLM2-135M-Instruct in ``smollm2.toml``): add two two-digit
  numbers, with a second chance. Each episode: ask "What is 27 + 82? Answer with the
  number only."; the answer is the last number of the reply. A wrong answer gets another
  user turn, "That is not right. Answer with the number only.", up to ``--max-turns``
  (default 2). Reward 1 for a right first answer, 0.5 for a right second one (halved
  again for each later turn), 0 when no answer is right: a group of attempts ranks
  "right at once" over "right when told" over "never right".

Each reward is posted to the asyncflow gateway's reward route (docs/gateway.md).
Episodes of one problem share a group key (the ``X-Group-Id`` header): asyncflow trains
them as one GRPO group.

    python examples/agent/agent.py --base-url http://127.0.0.1:8000/v1 --problems 120 --attempts 8
    python examples/agent/agent.py --base-url ... --task add2

Nothing here imports asyncflow: point ``--base-url`` at a run's gateway
(RUN_DIR/gateway.json has the URL) and the run trains on what this program does.
One JSON line per finished episode goes to ``--log`` (its reward and turns, in
finishing order).
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


async def calc_episode(
    api: openai.AsyncOpenAI, session: str, group: str, a: int, b: int, max_turns: int, max_tokens: int
) -> tuple[float, int]:
    chat: list[dict] = [{"role": "user", "content": f"{a}*{b}="}]
    answer = ""
    turns = 0
    while turns < max_turns:
        r = await api.chat.completions.create(
            model="policy", messages=chat, user=session, max_tokens=max_tokens, extra_headers={"X-Group-Id": group}
        )
        turns += 1
        answer = r.choices[0].message.content or ""
        chat.append({"role": "assistant", "content": answer})
        call = CALL.search(answer)
        if call is None:
            break
        chat.append({"role": "tool", "content": calculator(call.group(1))})
    return (1.0 if answer.strip() == str(a * b) else 0.0), turns


NUMBER = re.compile(r"-?\d[\d,]*")
RETRY = "That is not right. Answer with the number only."


def last_number(text: str) -> int | None:
    """The reply's answer: its last integer ("27 + 82 = 109." -> 109; "1,000" -> 1000)."""
    found = NUMBER.findall(text)
    digits = found[-1].replace(",", "") if found else ""
    return int(digits) if digits.lstrip("-").isdigit() else None


async def add2_episode(
    api: openai.AsyncOpenAI, session: str, group: str, a: int, b: int, max_turns: int, max_tokens: int
) -> tuple[float, int]:
    chat: list[dict] = [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}]
    for turn in range(max_turns):
        if turn:
            chat.append({"role": "user", "content": RETRY})
        r = await api.chat.completions.create(
            model="policy", messages=chat, user=session, max_tokens=max_tokens, extra_headers={"X-Group-Id": group}
        )
        answer = r.choices[0].message.content or ""
        chat.append({"role": "assistant", "content": answer})
        if last_number(answer) == a + b:
            return 0.5**turn, turn + 1
    return 0.0, max_turns


TASKS = {"calc": (calc_episode, 3, 24), "add2": (add2_episode, 2, 16)}
"""task -> (its episode, its default --max-turns, its default --max-tokens)."""


async def episode(
    api: openai.AsyncOpenAI, task: str, session: str, group: str, a: int, b: int, max_turns: int, max_tokens: int
) -> tuple[float, int]:
    """One episode of ``task``; its reward is posted to the gateway. Returns (reward, turns taken)."""
    reward, turns = await TASKS[task][0](api, session, group, a, b, max_turns, max_tokens)
    await api.post(f"/asyncflow/sessions/{session}/reward", body={"reward": reward}, cast_to=object)
    return reward, turns


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key", default="unused")
    p.add_argument("--problems", type=int, default=120, help="problems to solve (each --attempts times)")
    p.add_argument("--attempts", type=int, default=8, help="episodes per problem, one group")
    p.add_argument("--concurrency", type=int, default=4, help="problems in flight at once")
    p.add_argument("--task", choices=sorted(TASKS), default="calc")
    p.add_argument("--max-turns", type=int, help="model turns per episode (calc: 3, add2: 2)")
    p.add_argument("--max-tokens", type=int, help="max_tokens of each request (calc: 24, add2: 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", default="-", help="one JSON line per finished episode ('-': stdout)")
    args = p.parse_args()
    _, default_turns, default_tokens = TASKS[args.task]
    max_turns = args.max_turns or default_turns
    max_tokens = args.max_tokens or default_tokens
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
                done = await asyncio.gather(
                    *(episode(api, args.task, f"{group}-{j}", group, a, b, max_turns, max_tokens) for j in range(args.attempts))
                )
            except (openai.APIConnectionError, openai.APIStatusError) as exc:  # the run ended (or refused): stop
                stopped.set()
                print(f"agent: stopping at problem {k}: {exc}", file=sys.stderr)
                return
            for j, (r, turns) in enumerate(done):
                out.write(json.dumps({"problem": k, "attempt": j, "reward": r, "turns": turns, "t": time.time()}) + "\n")
            out.flush()

    await asyncio.gather(*(solve(k, a, b) for k, (a, b) in enumerate(problems)))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
