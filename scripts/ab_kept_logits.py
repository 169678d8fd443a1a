"""python scripts/ab_kept_logits.py models/smollm2-135m

A/B of the trainer's kept logits on the add2 shape: one train step of 64 rows (8 x 8), prompts ~46 tokens,
responses 4-16 tokens, micro-batch 16, SmolLM2-135M, 1 thread; kept vs full logits alternating, 3 rounds each."""

import json
import statistics
import sys
import time

import torch

torch.set_num_threads(1)
import asyncflow.engines.torch_train as tt
from asyncflow.algorithms.grpo import PolicyLossConfig, policy_loss_fn
from asyncflow.engines.batching import make_token_batch
from asyncflow.engines.config import TrainEngineConfig
from asyncflow.engines.factory import build_train_engine

d = sys.argv[1]
eng = build_train_engine(TrainEngineConfig(lr=1e-7, micro_batch_size=16), d)
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(10, 1000, (int(torch.randint(45, 48, (1,), generator=g)),), generator=g).tolist() for _ in range(64)]
resps = [torch.randint(10, 1000, (int(torch.randint(4, 17, (1,), generator=g)),), generator=g).tolist() for _ in range(64)]
tb = make_token_batch(
    prompts, resps, pad_token_id=0, rollout_logprobs=[[-2.0] * len(r) for r in resps], advantages_B=torch.randn(64, generator=g)
)
loss = policy_loss_fn(PolicyLossConfig())
kept_fn = tt.logits_start


def step(kept):
    tt.logits_start = kept_fn if kept else (lambda m: 0)
    t = time.perf_counter()
    eng.train_step(tb, loss)
    return time.perf_counter() - t


step(True)  # warm-up
times = {True: [], False: []}
for _ in range(3):
    for kept in (False, True):
        times[kept].append(step(kept))
full, kept = statistics.median(times[False]), statistics.median(times[True])
print(
    json.dumps(
        {
            "full_logits_s": round(full, 2),
            "kept_logits_s": round(kept, 2),
            "speedup": round(full / kept, 3),
            "rounds": {str(k): [round(x, 2) for x in v] for k, v in times.items()},
        }
    )
)
