"""A model's held-out greedy accuracy on built-in tasks before any training: is a task one
it is bad at (a low start) but not hopeless at?

For each ``--task``: the prompts a run of ``data.task = TASK`` writes (``data.num_prompts``
of them, ``data.seed``), the held-out ones the run evaluates (``eval.num_prompts``, drawn by
``split_prompts`` as the run draws them), encoded as the run encodes them (``prompt_ids``:
through the chat template or as plain text after the tokenizer's BOS), answered greedily by
the Hugging Face model in float32 (``--max-new-tokens``, stopping at ``--stop-token-ids``,
the EOS token by default, as the run's evaluation does) and scored by ``--reward`` (a run's ``reward.functions``; correct:
reward >= 1). Prints one line per task, some responses with ``--show``, then one JSON line.

    python scripts/start_accuracy.py --model models/gemma3-270m --no-chat-template --tasks add1 add2 --num-prompts 30 \\
        --stop-token-ids 1 $(seq 107 137)      # examples/gemma3.toml's: <eos> and every newline token
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def accuracy(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, batch_size: int, stop: list[int]) -> list[str]:
    """Greedy responses (decoded, special tokens dropped) to the prompts' token ids."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out: list[str] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in batch])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.no_grad():
            done = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=stop,
                pad_token_id=pad,
            )
        out += tokenizer.batch_decode(done[:, width:], skip_special_tokens=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a Hugging Face model directory (model.path)")
    parser.add_argument("--tasks", nargs="+", default=["add2"], help="built-in tasks (data.task)")
    parser.add_argument("--chat-template", action=argparse.BooleanOptionalAction, default=True, help="data.chat_template")
    parser.add_argument("--data-prompts", type=int, default=4000, help="data.num_prompts")
    parser.add_argument("--seed", type=int, default=0, help="data.seed")
    parser.add_argument("--num-prompts", type=int, default=256, help="eval.num_prompts: held-out prompts answered")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="rollout.sampling.max_new_tokens")
    parser.add_argument(
        "--stop-token-ids", type=int, nargs="*", default=None, help="rollout.sampling.stop_token_ids (default: the EOS token)"
    )
    parser.add_argument("--reward", default="math_answer", help="reward.functions: one function")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--show", type=int, default=0, help="print this many (prompt, response, answer) per task")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncflow.actors.runtime.run_dir import split_prompts
    from asyncflow.algorithms.rewards import load_reward_fn
    from asyncflow.engines.prompts import prompt_ids
    from asyncflow.toy.tasks import make_examples

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    reward = load_reward_fn(args.reward)
    results = {}
    for task in args.tasks:
        t0 = time.monotonic()
        rows = make_examples(args.data_prompts, seed=args.seed, task=task)
        _, heldout = split_prompts([r["prompt"] for r in rows], args.num_prompts, args.seed)
        ids = [prompt_ids(tokenizer, rows[i]["prompt"], args.chat_template) for i in heldout]
        answers = [rows[i]["answer"] for i in heldout]
        stop = args.stop_token_ids or [tokenizer.eos_token_id]
        responses = accuracy(model, tokenizer, ids, args.max_new_tokens, args.batch_size, stop)
        texts = [tokenizer.decode(p, skip_special_tokens=True) for p in ids]
        scores = reward(texts, responses, answers, ["length"] * len(responses))
        acc = sum(s >= 1.0 for s in scores) / len(scores)
        results[task] = {"accuracy": round(acc, 4), "num_prompts": len(scores), "seconds": round(time.monotonic() - t0, 1)}
        print(f"{task}: greedy accuracy {acc:.3f} on {len(scores)} held-out prompts ({time.monotonic() - t0:.0f} s)")
        for i in range(min(args.show, len(responses))):
            print(f"   {tokenizer.decode(ids[i])!r} -> {responses[i]!r} (answer {answers[i]}, reward {scores[i]})")
    line = {
        "start_accuracy": {
            "model": str(args.model),
            "chat_template": args.chat_template,
            "max_new_tokens": args.max_new_tokens,
            "stop_token_ids": args.stop_token_ids or "eos",
            "reward": args.reward,
            "tasks": results,
        }
    }
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
