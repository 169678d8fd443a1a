"""The trainer step with its logits kept from the first response position on
(``engines/torch_train.logits_start``) against the full forward, on the shape of
examples/smollm2.toml: 64 rows (8 x 8), prompts of 45-47 tokens, responses of 4-16,
micro-batch 16, one thread; a warm-up step, then full and kept alternating, 3 rounds
each, medians. One JSON line.

    python scripts/ab_kept_logits.py models/smollm2-135m
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

import asyncflow.engines.torch_train as torch_train
from asyncflow.algorithms.grpo import PolicyLossConfig, policy_loss_fn
from asyncflow.engines.batching import make_token_batch
from asyncflow.engines.config import TrainEngineConfig
from asyncflow.engines.factory import build_train_engine


def main(model_dir: str, rounds: int = 3) -> dict:
    torch.set_num_threads(1)
    engine = build_train_engine(TrainEngineConfig(lr=1e-7, micro_batch_size=16), model_dir)
    g = torch.Generator().manual_seed(0)

    def ids(low: int, high: int) -> list[int]:
        return torch.randint(10, 1000, (int(torch.randint(low, high, (1,), generator=g)),), generator=g).tolist()

    prompts = [ids(45, 48) for _ in range(64)]
    responses = [ids(4, 17) for _ in range(64)]
    batch = make_token_batch(
        prompts,
        responses,
        pad_token_id=0,
        rollout_logprobs=[[-2.0] * len(r) for r in responses],
        advantages_B=torch.randn(64, generator=g),
    )
    loss_fn = policy_loss_fn(PolicyLossConfig())
    kept_start = torch_train.logits_start

    def step(kept: bool) -> float:
        torch_train.logits_start = kept_start if kept else (lambda mask: 0)  # type: ignore[assignment]
        start = time.perf_counter()
        engine.train_step(batch, loss_fn)
        return time.perf_counter() - start

    step(True)  # warm-up
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for kept in (False, True):
            times[kept].append(step(kept))
    torch_train.logits_start = kept_start
    full, kept = statistics.median(times[False]), statistics.median(times[True])
    return {
        "full_logits_s": round(full, 2),
        "kept_logits_s": round(kept, 2),
        "speedup": round(full / kept, 3),
        "rounds": {"full": [round(x, 2) for x in times[False]], "kept": [round(x, 2) for x in times[True]]},
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
