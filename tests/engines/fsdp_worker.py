"""Run by torchrun from test_fsdp.py: two ranks train the same batch split in halves
with FSDP2 over gloo, then rank 0 writes the figures to a JSON file.

usage: fsdp_worker.py MODEL_DIR OUT_DIR
"""

import json
import os
import sys

import torch

torch.set_num_threads(1)

from asyncflow.engines.config import TrainEngineConfig  # noqa: E402
from asyncflow.engines.device import init_process_group  # noqa: E402
from asyncflow.engines.factory import build_train_engine  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from test_torch_train import batch, nll  # noqa: E402


def main(model_dir: str, out_dir: str) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_process_group("cpu", rank, world, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    trainer = build_train_engine(TrainEngineConfig(lr=1e-3, micro_batch_size=1, fsdp=True), model_dir)
    full = batch()
    half = full.split(2)[rank]
    results = [trainer.train_step(half, nll) for _ in range(2)]
    weights = {name: t.sum().item() for name, t in trainer.export_weights()}
    trainer.save_checkpoint(os.path.join(out_dir, "ckpt"))
    if rank == 0:
        figures = {"loss": [r.loss for r in results], "grad_norm": [r.grad_norm for r in results], "weights": weights}
        with open(os.path.join(out_dir, "figures.json"), "w") as f:
            json.dump(figures, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
