"""``[model]`` and ``[data]``: what a run starts from."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from asyncflow.config._section import Section
from asyncflow.core.schema import Refused
from asyncflow.engines.config import (
    Count,
    NonNegInt,
)


class ModelConfig(Section):
    """The policy model."""

    path: Annotated[
        str,
        Meta(
            description="The policy: any causal LM of transformers (an encoder-decoder or an encoder is refused before any "
            "process starts). A local Hugging Face directory (config.json, safetensors, tokenizer), relative to the config "
            "file or absolute; a run's checkpoint (``checkpoints/step_N``, or the link ``checkpoints/latest``); or a Hugging "
            "Face hub id ``org/name`` that is no existing path (``Qwen/Qwen3-0.6B``): its snapshot in the hub cache "
            "(HF_HUB_CACHE, HF_HOME), downloaded there unless HF_HUB_OFFLINE is set, resolved once as the config loads. "
            "Empty: build the tiny model (``tiny``) into ``RUN_DIR/model``. docs/your-model-and-data.md."
        ),
    ] = ""
    tiny: Annotated[
        Literal["qwen2", "llama"], Meta(description="Architecture of the tiny model built when ``path`` is empty.")
    ] = "qwen2"
    tiny_warm_start: Annotated[
        bool,
        Meta(
            description="Warm-start the tiny model with a short supervised pass on the task, stopped early (about 10% greedy "
            "accuracy), so RL has a signal from step one."
        ),
    ] = True
    tiny_warm_start_steps: Annotated[
        NonNegInt, Meta(description="Supervised steps of that warm start (more: a stronger start, less left to learn).")
    ] = 100


class DataConfig(Section):
    """Prompts: a local JSONL or Parquet file with ``prompt`` and ``answer`` fields."""

    path: Annotated[
        str,
        Meta(
            description="The data file, relative to the config file or absolute (fields: docs/your-model-and-data.md). Empty: generate "
            "the tiny arithmetic task (``task``) into ``RUN_DIR/data.jsonl``."
        ),
    ] = ""
    task: Annotated[
        str,
        Meta(
            description="Built-in task when ``path`` is empty (asyncflow.toy.tasks): add, reverse, calc for the tiny model; "
            "add2 (two-digit addition in words) for a real model (examples/smollm2.toml); add1 (one-digit addition in words, "
            "question and answer) for a base model (examples/gemma3.toml)."
        ),
    ] = "add"
    num_prompts: Annotated[Count, Meta(description="Prompts generated for the built-in task.")] = 2000
    chat_template: Annotated[bool, Meta(description="Apply the tokenizer's chat template to each prompt.")] = True
    shuffle: Annotated[bool, Meta(description="Shuffle the prompts (with ``order_seed``, else ``seed``) before each epoch.")] = (
        True
    )
    seed: Annotated[
        NonNegInt, Meta(description="Seed of generated tasks, of the held-out split and (unless ``order_seed``) of the shuffle.")
    ] = 0
    order_seed: Annotated[
        NonNegInt | None,
        Meta(
            description="Seed of the shuffle alone: the order the training prompts are given in, on the same data and "
            "held-out split. Unset: ``seed``. Another run of the same config on other prompts in each step changes this, "
            "``rollout.engine.seed`` and ``seed`` (``afctl bench peer``'s seeds do; TRL gets the same order)."
        ),
    ] = None

    @property
    def shuffle_seed(self) -> int:
        """The seed of the training prompts' order: ``order_seed``, else ``seed``."""
        return self.seed if self.order_seed is None else self.order_seed

    max_prompt_tokens: Annotated[
        NonNegInt,
        Meta(
            description="Longest prompt in tokens (as the loader encodes it, chat template included). The preflight reads "
            "every prompt of ``path`` before any process starts and refuses a longer one by its line. 0: what fits, the "
            "model's max_position_embeddings less ``rollout.sampling.max_new_tokens`` (that limit holds anyway)."
        ),
    ] = 0

    def check(self, run: object) -> None:
        if self.path and not self.path.endswith((".jsonl", ".parquet")):
            raise Refused("path", "use a .jsonl or .parquet file")
