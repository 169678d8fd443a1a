"""Run by torchrun from test_real_sizes.py: two ranks take one FSDP2 step over gloo on
a real-size model (each half of the batch), gather its export, save a checkpoint; rank
0 writes the step's figures and each exported tensor's sum to a JSON file.

usage: fsdp_real_size_worker.py MODEL_DIR OUT_DIR
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
    result = trainer.train_step(batch().split(2)[rank], nll)
    sums = {name: t.double().sum().item() for name, t in trainer.export_weights()}  # whole tensors, one at a time
    trainer.save_checkpoint(os.path.join(out_dir, "ckpt"), with_optimizer=False)
    if rank == 0:
        figures = {"loss": result.loss, "grad_norm": result.grad_norm, "export_sums": sums}
        with open(os.path.join(out_dir, "figures.json"), "w") as f:
            json.dump(figures, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
