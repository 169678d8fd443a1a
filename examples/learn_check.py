"""Does a tiny model really learn with GRPO on this machine? An in-process loop with
no queue and no actors, the whole RL step on one screen:

    generate (rollout engine) -> reward -> group advantages -> train step
    -> weights back into the rollout engine

Task (asyncflow.toy.tasks): one-digit addition, "3+4=" -> "7"; reward 0.1
for the format + 0.9 for the exact answer. The model is the tiny Qwen2 (hidden 64,
2 layers, about 0.1 M parameters) after a short supervised warm start, stopped early.
Prints the reward of every step and the greedy accuracy on all 100 prompts before
and after; exits 1 unless the mean reward of the last 10% of steps is above the
first 10%.

    python examples/learn_check.py                 # 400 steps, about 1-2 minutes
    python examples/learn_check.py --staleness 2   # train on samples 2 versions old
    python examples/learn_check.py --algo ppo      # critic + GAE instead of group advantages
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time

import torch

from asyncflow.algorithms.advantages import grpo_advantages
from asyncflow.algorithms.grpo import PolicyLossConfig, policy_loss_fn
from asyncflow.algorithms.ppo import PPOConfig, critic_loss_fn, ppo_advantages
from asyncflow.algorithms.rewards import call_reward
from asyncflow.toy.tasks import REWARDS, make_examples, make_task_model
from asyncflow.engines.batching import make_token_batch
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams, TrainEngineConfig
from asyncflow.engines.factory import build_rollout_engine, build_train_engine
from asyncflow.engines.hf import load_tokenizer
from asyncflow.toy.tiny import encode_chat_prompt


def greedy_accuracy(rollout, tokenizer, examples) -> float:
    prompts = [encode_chat_prompt(tokenizer, ex["prompt"]) for ex in examples]
    outs = rollout.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,)))
    texts = [tokenizer.decode(c.response_ids, skip_special_tokens=True) for c in outs]
    return sum(t.strip() == ex["answer"] for t, ex in zip(texts, examples)) / len(examples)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--task", default="add", choices=sorted(REWARDS))
    ap.add_argument("--algo", default="grpo", choices=["grpo", "ppo"], help="ppo: critic + GAE instead of group advantages")
    ap.add_argument("--prompts-per-step", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--std", type=int, default=1, help="0: do not divide advantages by the group std")
    ap.add_argument("--warm-start", default="task", choices=["task", "format"])
    ap.add_argument("--warm-steps", type=int, default=100)
    ap.add_argument("--staleness", type=int, default=0, help="train on samples generated this many versions ago")
    ap.add_argument("--tis-cap", type=float, default=2.0, help="truncated importance weight cap; 0 disables the correction")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    model_dir = make_task_model(
        tempfile.mkdtemp(prefix="learn_check_"),
        seed=args.seed,
        task=args.task,
        warm_start=args.warm_start,
        warm_start_steps=args.warm_steps,
    )
    tokenizer = load_tokenizer(model_dir)
    rollout = build_rollout_engine(RolloutEngineConfig(max_batch_size=256, seed=args.seed), model_dir)
    trainer = build_train_engine(TrainEngineConfig(lr=args.lr, micro_batch_size=128, grad_clip=1.0), model_dir)
    loss_fn = policy_loss_fn(PolicyLossConfig(tis_cap=args.tis_cap))
    if args.algo == "ppo":
        ppo = PPOConfig()
        critic = build_train_engine(TrainEngineConfig(lr=args.lr, micro_batch_size=128, critic=True), model_dir)
    reward_fn = REWARDS[args.task]
    n = args.group_size
    params = SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,), n=n)
    train_set = make_examples(1000, seed=args.seed + 1, task=args.task)
    eval_set = sorted({ex["prompt"]: ex for ex in make_examples(2000, seed=args.seed + 2, task=args.task)}.values(), key=str)[
        :100
    ]
    print(f"setup {time.perf_counter() - t0:.1f}s; greedy accuracy before: {greedy_accuracy(rollout, tokenizer, eval_set):.2f}")

    mean_rewards = []
    in_flight = collections.deque()  # batches generated, not yet trained on (staleness)
    t0 = time.perf_counter()
    for step in range(args.steps):
        batch = rng.sample(train_set, args.prompts_per_step)
        prompt_ids = [encode_chat_prompt(tokenizer, ex["prompt"]) for ex in batch]
        completions = rollout.generate(prompt_ids, params)  # ordered by (prompt, sample)
        rewards = call_reward(
            reward_fn,
            [batch[c.prompt_index]["prompt"] for c in completions],
            [tokenizer.decode(c.response_ids, skip_special_tokens=True) for c in completions],
            [batch[c.prompt_index]["answer"] for c in completions],
            [c.finish_reason for c in completions],
        )
        advantages_B = grpo_advantages(torch.tensor(rewards).view(-1, n), divide_by_std=bool(args.std)).view(-1)
        token_batch = make_token_batch(
            [prompt_ids[c.prompt_index] for c in completions],
            [c.response_ids for c in completions],
            tokenizer.pad_token_id,
            rollout_logprobs=[c.logprobs for c in completions],
            advantages_B=advantages_B,
        )
        if args.algo == "ppo":  # token advantages from the critic's values instead
            values_BT = critic.forward(token_batch).values
            token_batch.advantages, token_batch.returns = ppo_advantages(
                ppo, torch.tensor(rewards), values_BT, token_batch.response_mask
            )
            token_batch.old_values = values_BT
            critic.train_step(token_batch, critic_loss_fn(ppo))
        in_flight.append(token_batch)
        mean_rewards.append(sum(rewards) / len(rewards))
        exact = sum(r >= 0.9 for r in rewards) / len(rewards)
        if len(in_flight) <= args.staleness:
            continue  # the pipeline is filling: samples wait k versions before training
        result = trainer.train_step(in_flight.popleft(), loss_fn)
        rollout.load_weights(trainer.export_weights(), version=trainer.version)
        print(
            f"step {step:4d}  reward {mean_rewards[-1]:.3f}  exact {exact:.2f}  loss {result.loss:+.4f}  "
            f"grad_norm {result.grad_norm:.2f}  is_weight {result.metrics.get('is_weight', 1.0):.4f}  "
            f"entropy {result.metrics.get('entropy', 0.0):.3f}  t {time.perf_counter() - t0:.0f}s",
            flush=True,
        )
    tenth = max(1, args.steps // 10)
    first, last = sum(mean_rewards[:tenth]) / tenth, sum(mean_rewards[-tenth:]) / tenth
    print(f"mean reward first 10%: {first:.3f}  last 10%: {last:.3f}  ({time.perf_counter() - t0:.0f}s for {args.steps} steps)")
    print(f"greedy accuracy after: {greedy_accuracy(rollout, tokenizer, eval_set):.2f}")
    return 0 if last > first else 1


if __name__ == "__main__":
    sys.exit(main())
