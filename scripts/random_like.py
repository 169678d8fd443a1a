"""A model directory shaped like another, with random weights: the config, tokenizer and
chat template of SRC (no weights needed there) and ``model.safetensors`` drawn from
N(0, 0.02), norms one. For measuring speed at a real model's shapes where its weights
cannot travel (a GPU machine without a hub), never for learning.

    python scripts/random_like.py SRC_DIR OUT_DIR [--seed 0]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import safetensors.torch
import torch
from transformers import AutoConfig, AutoModelForCausalLM

KEEP = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def random_like(src: Path, out: Path, seed: int = 0) -> Path:
    config = AutoConfig.from_pretrained(src, local_files_only=True)
    with torch.device("meta"):
        shapes = AutoModelForCausalLM.from_config(config)  # names and shapes only
    g = torch.Generator().manual_seed(seed)
    weights = {
        name: torch.ones(p.shape) if name.endswith("norm.weight") else torch.empty(p.shape).normal_(0.0, 0.02, generator=g)
        for name, p in shapes.named_parameters()  # a tied head is the embedding: named once
    }
    out.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    for name in KEEP:
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = random_like(args.src, args.out, args.seed)
    n = sum(t.numel() for t in safetensors.torch.load_file(out / "model.safetensors").values())
    print(f"wrote {out}: {n / 1e6:.1f} M random parameters in the shapes of {args.src}")


if __name__ == "__main__":
    main()
