"""Run by torchrun from test_lora_fsdp.py: two ranks train LoRA adapters on the same
batch split in halves with FSDP2 over gloo, export the adapters (a gather), save a
checkpoint, then rank 0 writes the figures and the adapters.

usage: fsdp_lora_worker.py MODEL_DIR OUT_DIR
"""

import json
import os
import sys

import safetensors.torch
import torch

torch.set_num_threads(1)

from asyncflow.engines.device import init_process_group  # noqa: E402
from asyncflow.engines.factory import build_train_engine  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from test_lora import lora_cfg  # noqa: E402
from test_torch_train import batch, nll  # noqa: E402


def main(model_dir: str, out_dir: str) -> None:
    import msgspec

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_process_group("cpu", rank, world, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    trainer = build_train_engine(msgspec.structs.replace(lora_cfg(), micro_batch_size=1, fsdp=True), model_dir)
    half = batch().split(2)[rank]
    results = [trainer.train_step(half, nll) for _ in range(2)]
    snapshot = list(trainer.export_weights())
    digest = trainer.published_digest(snapshot, torch.float32)
    trainer.save_checkpoint(os.path.join(out_dir, "ckpt"))
    if rank == 0:
        safetensors.torch.save_file({n: t.contiguous() for n, t in snapshot}, os.path.join(out_dir, "adapters.safetensors"))
        figures = {"loss": [r.loss for r in results], "grad_norm": [r.grad_norm for r in results], "digest": digest}
        with open(os.path.join(out_dir, "figures.json"), "w") as f:
            json.dump(figures, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
