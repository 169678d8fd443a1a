"""Run by torchrun from test_sequence_packing_fsdp.py: two ranks train halves of a
long-tailed batch with FSDP2 over gloo and sequence packing, each rank packing its
own half (the halves pack into different numbers of micro-batches), then rank 0
writes the figures to a JSON file.

usage: fsdp_packing_worker.py MODEL_DIR OUT_DIR
"""

import json
import os
import sys

import torch

torch.set_num_threads(1)

from asyncflow.algorithms.grpo import PolicyLossConfig, policy_loss_fn  # noqa: E402
from asyncflow.engines.base import TokenBatch  # noqa: E402
from asyncflow.engines.batching import make_token_batch, plan_packing  # noqa: E402
from asyncflow.engines.config import TrainEngineConfig  # noqa: E402
from asyncflow.engines.device import init_process_group  # noqa: E402
from asyncflow.engines.factory import build_train_engine  # noqa: E402

RESPONSE_LENGTHS = [26, 2, 1, 1, 2, 3, 24, 3, 22, 2, 20, 4]
"""Rank 0's half: one long response and five short; rank 1's: three long, three short."""
MICRO_BATCH_SIZE = 2


def uneven_batch() -> TokenBatch:
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(6, 90, (4,), generator=g).tolist() for _ in RESPONSE_LENGTHS]
    responses = [torch.randint(6, 90, (n,), generator=g).tolist() for n in RESPONSE_LENGTHS]
    rollout = [(-2.0 - torch.rand(n, generator=g)).tolist() for n in RESPONSE_LENGTHS]
    advantages_B = torch.randn(len(RESPONSE_LENGTHS), generator=g)
    return make_token_batch(prompts, responses, pad_token_id=0, rollout_logprobs=rollout, advantages_B=advantages_B)


def loss_fn():
    return policy_loss_fn(PolicyLossConfig())


def main(model_dir: str, out_dir: str) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_process_group("cpu", rank, world, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    cfg = TrainEngineConfig(lr=1e-3, micro_batch_size=MICRO_BATCH_SIZE, fsdp=True, packing=True)
    trainer = build_train_engine(cfg, model_dir)
    half = uneven_batch().split(len(RESPONSE_LENGTHS) // world)[rank]
    lengths = half.attention_mask.sum(dim=1).tolist()
    own_plan = len(plan_packing(lengths, max(lengths), MICRO_BATCH_SIZE))
    forwards: list[int] = []
    trainer.net.register_forward_pre_hook(lambda module, args: forwards.append(args[0].numel()))
    results = [trainer.train_step(half, loss_fn()) for _ in range(2)]
    num_forwards, fed_tokens = len(forwards), sum(forwards)
    logp = trainer.forward(half).logp
    figures = {
        "rank": rank,
        "own_plan": own_plan,
        "forwards": num_forwards,
        "fed_tokens": fed_tokens,
        "loss": [r.loss for r in results],
        "grad_norm": [r.grad_norm for r in results],
        "logp": logp.tolist(),
        "pack_attention": trainer.pack_attention,
    }
    with open(os.path.join(out_dir, f"figures{rank}.json"), "w") as f:
        json.dump(figures, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
