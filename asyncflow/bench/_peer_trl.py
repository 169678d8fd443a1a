"""TRL's GRPOTrainer on asyncflow's task, in a process of its own (``afctl bench peer``).

    python -m asyncflow.bench._peer_trl SPEC.json  ->  one JSON line on stdout

SPEC (written by ``bench/peer.py`` from the run config): the model directory, the
data file, the reward functions, prompts per step, group size, new tokens,
temperature, lr and its schedule, clip, grad clip, mixed precision (``bf16`` when
the trainer's ``autocast`` resolves to bfloat16), the trainer's device (TRL runs on the
GPU when it is ``cuda``), steps, seed, threads. The
prompts go through the model's chat template as TRL does for conversational data
(the same ids asyncflow's loader puts in the queue); the reward functions get what
asyncflow's reward role gives them: decoded prompt and response, the answer, and
"stop" or "length". Loss: token mean over the batch (TRL ``dapo`` = asyncflow
``token_mean``); advantages normalised within each group (``scale_rewards="group"``
= ``std_normalize``); no KL (``beta=0``), one optimizer step per batch; no
gradient checkpointing (TRL's default, a memory saving this model does not need).
The lr at every step is asyncflow's (``engines/lr_schedule.lr_at``: warmup from lr / W,
then constant or cosine to ``lr_min_ratio``), given to TRL as its scheduler: Hugging
Face's own schedulers start their warmup at 0, so TRL's first step would not move the
weights and its lr summed over a 10-step run would be 9% lower (``lrs``: what it
trained with, step by step). With ``train.engine.lr_schedule_convention = "huggingface"``
both train at the lr transformers' schedulers give.

Samples/s is the training time only: ``train_runtime`` (generation, reward and
update; not the model load) over steps x samples per step. The last-10% reward is
the mean of the logged per-step reward over the last tenth of the steps. The
prompts of each step are those asyncflow's loader gives that step (``in_asyncflows_order``;
``prompts_by_step``: what TRL's reward function was given, step by step). With
``heldout_prompts`` (the config has ``[eval]``) TRL trains on asyncflow's training split
only and saves its final weights (after the timing) for bench peer's held-out evaluation.

``trl_path`` picks TRL's generation path (``PATHS``): ``default``, GRPOConfig as it ships,
or ``fast``, its fastest without vLLM (``path_args``: the keys, and the figures that chose
them). Both train the same way; ``generation`` in the output is what TRL's config held.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any


def run(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from asyncflow.actors.runtime.run_dir import encode_prompt, read_prompts
    from asyncflow.actors.runtime.scoring import build_reward_fn
    from asyncflow.algorithms.rewards import call_reward

    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"], local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32, local_files_only=True)
    rows = read_prompts(spec["data_path"])
    if spec.get("heldout_prompts"):  # [eval]: train on asyncflow's training split only, as its loader does
        from asyncflow.actors.runtime.run_dir import split_prompts

        train_idx, _ = split_prompts([str(r["prompt"]) for r in rows], spec["heldout_prompts"], spec["data_seed"])
        rows = [rows[i] for i in train_idx]
    rows = in_asyncflows_order(rows, spec)
    prompts: list[Any]
    if spec["chat_template"]:
        prompts = [[{"role": "user", "content": str(r["prompt"])}] for r in rows]
    else:
        prompts = [str(r["prompt"]) for r in rows]
    data = Dataset.from_dict({"prompt": prompts, "answer": [str(r["answer"]) for r in rows]})
    fn = build_reward_fn(spec["reward_functions"], spec["reward_weights"])
    eos = tokenizer.eos_token_id

    prompts_by_step: list[list[str]] = []  # each reward call's distinct prompts: one call per step

    def reward(prompts, completions, completion_ids, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        shown = [p[-1]["content"] if isinstance(p, list) else p for p in prompts]
        prompts_by_step.append(list(dict.fromkeys(shown)))
        finish = ["stop" if eos in ids else "length" for ids in completion_ids]
        return call_reward(fn, shown, texts, answer, finish)

    reward.__name__ = "asyncflow_reward"
    longest = max(len(encode_prompt(tokenizer, str(r["prompt"]), spec["chat_template"])) for r in rows)
    generation = path_args(spec.get("trl_path", "default"), spec, longest)
    factor = lr_factor(spec)
    lrs: list[float] = []

    class Trainer(GRPOTrainer):
        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:  # asyncflow's schedule, not one of Hugging Face's
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, factor)
                self._created_lr_scheduler = True
            return self.lr_scheduler

    class RecordLr(TrainerCallback):
        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            if optimizer is not None:
                lrs.append(float(optimizer.param_groups[0]["lr"]))

    base = dict(
        output_dir=spec["out_dir"],
        max_steps=spec["steps"],
        per_device_train_batch_size=spec["samples_per_step"],
        num_generations=spec["group_size"],
        max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        learning_rate=spec["lr"],
        epsilon=spec["clip_low"],
        epsilon_high=spec["clip_high"],
        beta=0.0,
        num_iterations=1,
        shuffle_dataset=False,  # the rows are already in asyncflow's order (in_asyncflows_order)
        loss_type="dapo",
        scale_rewards="group",
        max_grad_norm=spec["grad_clip"],
        weight_decay=0.0,
        seed=spec["seed"],
        use_cpu=spec.get("device", "cpu") == "cpu",
        bf16=spec.get("bf16", False),
        fp16=False,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        gradient_checkpointing=False,  # TRL's default recomputes the forward to save memory; nothing to save here
    )
    args = GRPOConfig(**{**base, **generation})
    trainer = Trainer(
        model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer, callbacks=[RecordLr()]
    )
    started = time.monotonic()
    out = trainer.train()
    wall = time.monotonic() - started
    final_model = ""
    if spec.get("heldout_prompts"):  # the trained weights, for the held-out evaluation bench peer runs (not timed)
        final_model = spec["out_dir"] + "/final"
        trainer.save_model(final_model)
        tokenizer.save_pretrained(final_model)
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    tail = rewards[-max(1, len(rewards) // 10) :] if rewards else [float("nan")]
    runtime = out.metrics.get("train_runtime", wall)
    return {
        "samples_per_s": spec["steps"] * spec["samples_per_step"] / runtime,
        "train_runtime_s": runtime,
        "reward_last_10pct": sum(tail) / len(tail),
        "reward_first": rewards[0] if rewards else None,
        "steps": len(rewards),
        "trl_path": spec.get("trl_path", "default"),
        # the generation keys as TRL's config holds them after its own checks: what this path ran with
        "generation": {k: getattr(trainer.args, k) for k in generation},
        "threads": spec["threads"],
        "bf16": bool(trainer.args.bf16),  # the path's (the fast path trains in float32)
        "final_model": final_model,
        "lrs": lrs,
        "prompts_by_step": prompts_by_step,
        "reward_by_step": rewards,
    }


PATHS = ("default", "fast")
"""TRL's generation paths that ``bench peer`` runs: ``default``, GRPOConfig as it ships
(``model.generate`` with a dynamic cache, no compile); ``fast``, its fastest without vLLM
on the trainer's device (``path_args``)."""


def path_args(path: str, spec: dict, longest_prompt: int) -> dict[str, Any]:
    """GRPOConfig's generation keys of TRL's ``path`` (``PATHS``), for prompts of at
    most ``longest_prompt`` tokens."""
    if path == "default":
        return {}
    if path != "fast":
        raise ValueError(f"trl_path = {path!r}: give one of {', '.join(PATHS)}")
    # Measured on SmolLM2 (examples/smollm2.toml: 8 prompts x 8 samples, 16 new tokens), TRL on 2 threads, 2 shared
    # cores, TRL 1.16, transformers 5.25, torch 2.13 (avx512_bf16, bf16 autocast on):
    # - continuous batching with bf16 mixed precision fails in its first generation (accelerate's fp32 output wrapper
    #   calls .float() on the PagedAttentionCache): it runs only with bf16=False, and TRL then trains in float32;
    #   with its cache sized from memory by default, it ran 35x slower than generate on the tiny model (a cache of
    #   gigabytes allocated every step), so it is sized here to one step's requests;
    # - generation alone, 16 rows x 16 tokens, in turn in one process at a load of 10 to 30: generate under bf16
    #   autocast 34-89 s, static cache 25-68 s (GRPOConfig sets disable_compile: it runs eager), continuous
    #   batching in float32 10-13 s; a whole 1-step TRL run with the static cache: 0.20 samples/s (load 24-30);
    # - whole 10-step runs, one after the other at a load of about 2: default 3.52 samples/s, this path 1.82
    #   (0.52x: float32 training costs 1.85x bf16's here, docs/real-model.md real_train). Under a heavy load
    #   (10 to 30) this path ran at 1.13 and default at 0.40 (2 steps): which wins moves with the load.
    # So this path is TRL's continuous batching, the option TRL offers without vLLM to speed up generation; on an
    # idle 2-core CPU its default is faster, and bench peer compares asyncflow with whichever of the two measured
    # faster in the run (trl_comparison). Not measured on a GPU.
    page = 32
    blocks = -(-(longest_prompt + spec["max_new_tokens"]) // page)
    cache = {"page_size": page, "num_blocks": spec["samples_per_step"] * blocks}
    cache["max_batch_tokens"] = spec["samples_per_step"] * longest_prompt
    return {"use_transformers_continuous_batching": True, "transformers_continuous_batching_config": cache, "bf16": False}


def in_asyncflows_order(rows: list[dict], spec: dict) -> list[dict]:
    """The training rows in the order asyncflow's loader gives them: step s, group g is
    ``PromptOrder(...).index(s, g)`` over the training split (``data.shuffle``, the seed
    ``data.shuffle_seed``), for ``spec["steps"]`` steps. TRL reads them in this order
    (``shuffle_dataset=False``), so both systems train on the same prompts at every step
    and a seed's comparison is paired by its data; without, TRL shuffled with its own
    seed and the two saw different prompts."""
    from asyncflow.actors.runtime.run_dir import PromptOrder

    per_step = spec["samples_per_step"] // spec["group_size"]
    order = PromptOrder(len(rows), per_step, spec["shuffle"], spec["order_seed"])
    return [rows[order.index(step, g)] for step in range(spec["steps"]) for g in range(per_step)]


def lr_factor(spec: dict) -> Callable[[int], float]:
    """The multiple of ``spec["lr"]`` at optimizer step k: asyncflow's schedule for the
    spec's warmup, schedule, minimum ratio and number of steps."""
    from asyncflow.engines.config import TrainEngineConfig
    from asyncflow.engines.lr_schedule import lr_at

    cfg = TrainEngineConfig(
        lr=spec["lr"],
        lr_warmup_steps=spec["warmup_steps"],
        lr_schedule=spec["lr_schedule"],
        lr_min_ratio=spec["lr_min_ratio"],
        lr_schedule_convention=spec.get("lr_schedule_convention", "asyncflow"),
    )
    return lambda k: lr_at(cfg, k, spec["steps"]) / spec["lr"]


def main() -> int:
    spec = json.loads(open(sys.argv[1]).read())
    print(json.dumps({"trl": run(spec)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
