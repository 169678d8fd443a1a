"""Write a self-contained "your own model and data" example into a directory:

    DIR/model/        a small Llama saved with save_pretrained, and its own tokenizer
                      (character level, with NO chat template, like many base models)
    DIR/data.jsonl    {"prompt": "What is 3 plus 4?", "answer": "7"} per line
    DIR/my_reward.py  a reward for this answer format (the last integer in the response)
    DIR/run.toml      the config: paths relative to itself, data.chat_template = false

    python examples/your_model/make_example.py DIR && afctl up DIR/run.toml

docs/your-model-and-data.md walks through each file; tests/runs/test_your_model.py
and scripts/newcomer.sh run it. Nothing is downloaded.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

REWARD = '''"""Reward of the example: 1.0 when the last integer in the response is the answer,
0.1 when the response holds an integer at all, else 0."""

import re


def last_integer(prompts, responses, answers, finish_reasons):
    out = []
    for response, answer in zip(responses, answers):
        numbers = re.findall(r"-?\\d+", response)
        out.append(1.0 if numbers and numbers[-1] == answer else (0.1 if numbers else 0.0))
    return out
'''

CONFIG = """# Your own model and data (docs/your-model-and-data.md). Paths are relative to this file.
seed = 0

[model]
path = "model"

[data]
path = "data.jsonl"
chat_template = false      # this tokenizer has no chat template: prompts go in as plain text

[algorithm]
group_size = 2

[rollout]
prompts_per_call = 2
[rollout.sampling]
max_new_tokens = 4

[reward]
functions = ["my_reward:last_integer"]   # my_reward.py, found through cluster.python_path

[train]
num_steps = 3
prompts_per_step = 2
[train.engine]
lr = 1e-3

[cluster]
python_path = ["."]
"""


def write_example(out: str | Path, arch: str = "llama", num_prompts: int = 64) -> Path:
    """The example's files in ``out``; returns the config's path."""
    import torch
    from transformers import AutoModelForCausalLM

    from asyncflow.toy.tiny import build_char_tokenizer, tiny_config

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None  # a base model's tokenizer: no template
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, num_layers=1), dtype=torch.float32)
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    rng = random.Random(0)
    with (out / "data.jsonl").open("w") as f:
        for _ in range(num_prompts):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            f.write(json.dumps({"prompt": f"What is {a} plus {b}?", "answer": str(a + b)}) + "\n")
    (out / "my_reward.py").write_text(REWARD)
    (out / "run.toml").write_text(CONFIG)
    return out / "run.toml"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/your_model/make_example.py DIR")
    print(write_example(sys.argv[1]))
