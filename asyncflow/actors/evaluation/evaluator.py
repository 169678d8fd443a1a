"""Evaluation of the policy on the held-out prompts (``[eval]``), and the records it
keeps: eval.jsonl, eval_samples.jsonl and the ``checkpoints/best`` weights.

After publishing version v, the trainer (rank 0 only) either calls ``Evaluator.run_one``
itself with the snapshot it published, or asks the ``evaluator`` process to
(``actor.py``, ``eval.where``), which fetches the version from the ``weights`` actor. A
private rollout engine (``type = "auto"``: native, or hf for a model the native engine
does not run) loads the weights and generates for every held-out prompt
(``split_prompts``: never trained on), greedy or k samples; the run's reward functions
score the responses.

With an environment (``[env] path``) each response is an episode instead, run as
training runs them: ``rollout/multiturn.py``'s ``MultiTurnDriver`` drives it with
the private engine (the model's turns, the environment's steps and tool calls, the
turn and context limits), and it is scored as the reward role scores a training
row (``runtime/scoring.Scorer``: the reward functions on the decoded transcript combined
with the environment's reward by ``env.reward``; 0 after an environment error).

Figures (``val/*``, in eval.jsonl and metrics.jsonl): a response is correct when its reward is at
least ``eval.correct_reward``. ``val/accuracy``: fraction of correct responses (in
greedy mode: of prompts answered correctly). ``val/reward_mean``: mean reward.
``val/pass_at_k`` (pass_at_k mode): fraction of prompts with a correct response
among their k. With an environment also ``val/env/*``: training's ``env/*``
figures (``runtime/scoring.env_sums``) over the held-out episodes.

Best weights: ``save_best`` writes the snapshot as a Hugging Face directory
``checkpoints/best_<version>`` (weights, config and tokenizer: no optimizer, so it
is not a resume point), then re-points the relative link ``checkpoints/best`` at it
and rewrites ``checkpoints/best.json``, then removes the previous ``best_*``. None of
these names match ``step_*``, so ``latest_checkpoint`` never sees them. A resumed
run starts from the best in best.json (possibly from steps it trains again).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import msgspec
import numpy as np
import torch

from asyncflow.actors.runtime.run_dir import Run, encode_prompt, read_prompts, split_prompts

if TYPE_CHECKING:
    from asyncflow.actors.rollout.multiturn import MultiTurnDriver
    from asyncflow.engines.base import RolloutEngine
    from asyncflow.engines.config import SamplingParams

log = logging.getLogger(__name__)

BEST = "best"
EVAL_FILE = "eval.jsonl"
"""RUN_DIR/eval.jsonl: one line per evaluation (step, version, its ``val/*``), whichever
process ran it; metrics.jsonl carries the same figures in the record of the step they
reached the trainer by."""
EVAL_SAMPLES_FILE = "eval_samples.jsonl"


class Completions(NamedTuple):
    """An evaluation's responses, in order: each one's held-out prompt, text, reward, finish."""

    prompt_index: list[int]
    texts: list[str]
    rewards: list[float]
    finish: list[str] | None


class Evaluator:
    def __init__(self, run: Run, device: str | None = None):
        """``device``: where its engine runs (``cpu``, ``cuda``, ``npu``; the current device
        of that kind); the trainer's (``train.engine.device``) by default."""
        from asyncflow.actors.runtime.scoring import Scorer, build_reward_fn

        cfg = run.config
        self.run = run
        self.cfg = cfg.eval
        self.tokenizer = run.hf_tokenizer()
        rows = read_prompts(run.launch.data_path)
        _, heldout = split_prompts([str(r["prompt"]) for r in rows], cfg.eval.num_prompts, cfg.data.seed)
        self.prompt_ids = [encode_prompt(self.tokenizer, rows[i]["prompt"], cfg.data.chat_template).tolist() for i in heldout]
        # the reward functions get what the reward role gives them: the decoded prompt tokens
        self.prompts = [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in self.prompt_ids]
        self.answers = [str(rows[i]["answer"]) for i in heldout]
        self.reward_fn = build_reward_fn(cfg.reward.functions, cfg.reward.weights)
        sampling = cfg.rollout.sampling
        greedy = cfg.eval.mode == "greedy"
        self.params = msgspec.structs.replace(
            sampling,
            n=1 if greedy else cfg.eval.k,
            temperature=0.0 if greedy else sampling.temperature,
            max_new_tokens=cfg.eval.max_new_tokens or sampling.max_new_tokens,
            stop_token_ids=tuple(sampling.stop_token_ids or (self.tokenizer.eos_token_id,)),
        )
        device = device or cfg.train.engine.device
        index = {"cuda": lambda: torch.cuda.current_device(), "npu": lambda: torch.npu.current_device()}  # type: ignore[attr-defined]
        # a KV cache of a fixed size (never a fraction of what training left free on a shared device)
        self.engine_cfg = msgspec.structs.replace(
            cfg.rollout.engine,
            type="hf" if cfg.rollout.engine.type == "hf" else "auto",  # the local engines: native where it runs the model
            device=device,
            device_index=index[device]() if device in index else 0,
            kv_cache_fraction=None,
            num_threads=None,
            seed=cfg.seed,
        )
        self.engine: RolloutEngine | None = None  # built at the first evaluation
        # [env] path: episodes through the environment, scored as the reward role scores training rows
        self.env_cfg = cfg.env
        self.driver: MultiTurnDriver | None = None  # built at the first evaluation (its pool of environment threads)
        self.scorer = Scorer(cfg, self.tokenizer) if cfg.env.path else None
        self.completions: Completions | None = None  # the last evaluation's, for the sample log

        best = read_best(run.dir)
        self.best = best["value"] if best else float("-inf")  # best val/accuracy so far (kept across a resume by best.json)

    def run_one(
        self, step: int, snapshot: list[tuple[str, torch.Tensor]] | None, version: int, save: bool = True
    ) -> dict[str, float]:
        """Evaluate version ``version`` (``snapshot``: its weights; None: the weights the engine
        was built with, the model directory's), record it (eval_samples.jsonl, eval.jsonl) and,
        with ``save`` and ``eval.save_best``, save it as ``checkpoints/best`` when its
        ``val/accuracy`` beats every earlier one. ``step``: the metrics.jsonl record the
        figures belong to (``version - 1``; 0 for the start weights). Returns ``val/*`` with
        ``val/time_s`` and ``val/version``."""
        t0 = time.monotonic()
        values = self.evaluate(snapshot, version)
        self.write_samples(step, version)  # what it wrote: eval_samples.jsonl
        if save and snapshot is not None and self.cfg.save_best and values["val/accuracy"] > self.best:
            path = save_best(self.run.dir, snapshot, self.run.launch.model_dir, step, values)
            self.best = values["val/accuracy"]
            log.info("step %d: val/accuracy %.3f, a new best: %s", step + 1, self.best, path)
        values["val/time_s"] = time.monotonic() - t0
        values["val/version"] = float(version)  # the policy version evaluated (0: the start weights)
        _append(Path(self.run.dir) / EVAL_FILE, [{"step": step, "version": version, **values}])
        return values

    def write_samples(self, step: int, version: int) -> None:
        """The last evaluation's completions into the run's eval_samples.jsonl."""
        c = self.completions
        if c is None:
            return
        prompts, answers = [self.prompts[p] for p in c.prompt_index], [self.answers[p] for p in c.prompt_index]
        append_eval_samples(self.run.dir, step, version, prompts, c.texts, c.rewards, answers, c.finish)

    def evaluate(self, snapshot: list[tuple[str, torch.Tensor]] | None, version: int) -> dict[str, float]:
        """The ``val/*`` figures of the policy with these weights (HF names, any device;
        None: the model directory's, which the engine is built with)."""
        from asyncflow.engines.factory import build_rollout_engine

        if self.engine is None:
            self.engine = build_rollout_engine(self.engine_cfg, self.run.launch.model_dir, version=version)
        if snapshot is not None:
            self.engine.load_weights(snapshot, version)
        params = self.params if self.params.temperature == 0 else msgspec.structs.replace(self.params, seed=version)
        if self.env_cfg.path:
            rewards, prompt_index, figures = self._episodes(self.engine, params)
        else:
            rewards, prompt_index = self._responses(self.engine, params)
            figures = {}
        return {**self._scores(rewards, prompt_index), **figures}

    def _responses(self, engine: RolloutEngine, params: SamplingParams) -> tuple[list[float], list[int]]:
        """Single-turn: ``params.n`` responses per held-out prompt in one generate call,
        scored by the reward functions; (rewards, each one's prompt)."""
        from asyncflow.algorithms.rewards import call_reward

        outs = engine.generate(self.prompt_ids, params)  # ordered by (prompt, sample)
        texts = [self.tokenizer.decode(c.response_ids, skip_special_tokens=True) for c in outs]
        finish: list[str] = [c.finish_reason for c in outs]
        index = [c.prompt_index for c in outs]
        rewards = call_reward(self.reward_fn, [self.prompts[p] for p in index], texts, [self.answers[p] for p in index], finish)
        self.completions = Completions(index, texts, list(rewards), finish)
        return rewards, index

    def _episodes(self, engine: RolloutEngine, params: SamplingParams) -> tuple[list[float], list[int], dict[str, float]]:
        """With an environment: ``params.n`` episodes per held-out prompt, driven by the
        rollout's multi-turn driver with this engine and scored as the reward role
        scores training rows (so that ``val/*`` measures what training optimises);
        (rewards, each one's prompt, the ``val/env/*`` figures)."""
        from asyncflow.actors.rollout import pack
        from asyncflow.actors.rollout.multiturn import MultiTurnDriver
        from asyncflow.envs.base import Sample

        assert self.scorer is not None  # made with [env] path
        if self.driver is None:
            self.driver = MultiTurnDriver(self.env_cfg, self.tokenizer, context_tokens=self.run.context_tokens())
        index = [p for p in range(len(self.prompt_ids)) for _ in range(params.n)]  # the driver takes one sample per episode
        samples = [Sample(prompt=self.prompts[p], prompt_ids=self.prompt_ids[p], answer=self.answers[p]) for p in index]
        episodes = self.driver.run(engine, params, samples)
        columns = pack.columns([e.columns() for e in episodes])
        columns["prompt_ids"] = [np.asarray(self.prompt_ids[p], dtype=np.int64) for p in index]
        columns["answer"] = [np.frombuffer(self.answers[p].encode(), dtype=np.uint8) for p in index]
        rewards = self.scorer.score(columns, index)
        texts = [self.tokenizer.decode(r, skip_special_tokens=True) for r in columns["response_ids"]]
        self.completions = Completions(index, texts, list(rewards), None)
        return rewards, index, env_figures(columns)

    def _scores(self, rewards: list[float], prompt_index: list[int]) -> dict[str, float]:
        """``val/accuracy``, ``val/reward_mean`` (and ``val/pass_at_k``) of these rewards,
        the i-th that of a response to prompt ``prompt_index[i]``."""
        correct = [r >= self.cfg.correct_reward for r in rewards]
        values = {"val/accuracy": sum(correct) / len(correct), "val/reward_mean": sum(rewards) / len(rewards)}
        if self.cfg.mode == "pass_at_k":
            passed = [False] * len(self.prompt_ids)
            for p, ok in zip(prompt_index, correct):
                passed[p] |= ok
            values["val/pass_at_k"] = sum(passed) / len(passed)
        return values

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        if self.driver is not None:
            self.driver.close()
            self.driver = None


def env_figures(columns: dict[str, list]) -> dict[str, float]:
    """``val/env/*`` of held-out episodes (their packed columns): training's ``env/*``
    (docs/metrics.md) computed the same way, from the same sums (``policy.env_sums``)."""
    from asyncflow.actors.runtime.scoring import env_sums

    with_calls, calls, errors, env_reward, model_tokens = env_sums(columns)
    n = max(len(columns["response_ids"]), 1)
    response = max(sum(len(r) for r in columns["response_ids"]), 1)
    return {
        "val/env/tool_call_rate": with_calls / n,
        "val/env/tool_calls_mean": calls / n,
        "val/env/error_rate": errors / n,
        "val/env/reward_mean": env_reward / n,
        "val/env/model_token_frac": model_tokens / response,
    }


def evaluate_saved(run_dir: str | Path, model_dir: str | Path) -> dict[str, float]:
    """``val/*`` of the weights saved in ``model_dir`` (a Hugging Face directory of the
    run's architecture, e.g. another framework's result) on the held-out prompts of the
    run in ``run_dir``, exactly as its trainer evaluates its own versions."""
    from asyncflow.engines.hf import load_model

    evaluator = Evaluator(Run(run_dir))
    try:
        weights = [(name, p.detach()) for name, p in load_model(model_dir).named_parameters()]
        return evaluator.evaluate(weights, version=0)
    finally:
        evaluator.close()


def append_eval_samples(
    run_dir: str | Path,
    step: int,
    version: int,
    prompts: Sequence[str],
    completions: Sequence[str],
    rewards: Sequence[float],
    answers: Sequence[str],
    finish: Sequence[str] | None = None,
) -> None:
    """Append one evaluation's completions to RUN_DIR/eval_samples.jsonl, one row each, in
    the order given: ``step``, the metrics.jsonl record its ``val/*`` figures belong to (0
    for the start evaluation); ``version``, the policy version evaluated (0 at the start,
    ``step + 1`` after a step); the i-th prompt, its completion (decoded text), reward and
    reference answer; ``finish`` (optional): each one's finish reason (``stop``,
    ``length``), else null. ``afctl samples --eval RUN_DIR`` prints them."""
    num = len(completions)
    if not (len(prompts) == len(rewards) == len(answers) == num and (finish is None or len(finish) == num)):
        raise ValueError(
            "append_eval_samples takes one prompt, completion, reward and answer per row (and one finish reason, when given): "
            f"got {len(prompts)} prompts, {num} completions, {len(rewards)} rewards, {len(answers)} answers"
            + (f", {len(finish)} finish reasons" if finish is not None else "")
        )
    rows = [
        {
            "step": step,
            "version": version,
            "prompt": prompts[i],
            "response": completions[i],
            "reward": float(rewards[i]),
            "answer": answers[i],
            "finish": finish[i] if finish is not None else None,
        }
        for i in range(num)
    ]
    _append(Path(run_dir) / EVAL_SAMPLES_FILE, rows)


def _append(path: Path, rows: list[dict]) -> None:
    """One write per call: a reader (``tail -f``, ``afctl samples``) sees whole lines."""
    with path.open("a") as f:
        f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def read_best(run_dir: str | Path) -> dict | None:
    """``checkpoints/best.json`` (step, version, metric, value, path), if any."""
    path = Path(run_dir) / "checkpoints" / f"{BEST}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def save_best(
    run_dir: str | Path, snapshot: list[tuple[str, torch.Tensor]], like_dir: str | Path, step: int, values: dict[str, float]
) -> Path:
    """Write the weights of policy version ``step + 1`` as the best so far; returns its
    directory. A LoRA snapshot (adapters only) is written like a LoRA checkpoint: the
    base weights of ``like_dir`` and ``adapter/`` in peft's layout."""
    import safetensors.torch

    from asyncflow.engines.hf import TOKENIZER_FILES

    root = Path(run_dir) / "checkpoints"
    final = root / f"{BEST}_{step + 1:06d}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    from asyncflow.engines.lora import ADAPTER_DIR, save_adapter, split

    full, adapters = split(snapshot)
    if adapters:  # a LoRA snapshot: the base weights of like_dir and the adapter, as a LoRA checkpoint
        shutil.copy(Path(like_dir) / "model.safetensors", tmp / "model.safetensors")
        first = next(iter(adapters.values()))
        rank = first.A_RI.shape[0]
        targets = {module.rsplit(".", 1)[-1] for module in adapters}
        alpha = float(first.scaling) * rank
        save_adapter(tmp / ADAPTER_DIR, adapters, rank, alpha, 0.0, targets, str(Path(like_dir).resolve()))
    else:
        tensors = {name: t.detach().to("cpu").contiguous() for name, t in full}
        safetensors.torch.save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    for name in ("config.json", *TOKENIZER_FILES):
        if (Path(like_dir) / name).is_file():
            shutil.copy(Path(like_dir) / name, tmp / name)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    link = root / BEST
    tmp_link = root / f".{BEST}.link"
    if tmp_link.is_symlink():
        tmp_link.unlink()
    os.symlink(final.name, tmp_link)  # relative: the run directory can move
    os.replace(tmp_link, link)
    record = {
        "step": step,
        "version": step + 1,
        "metric": "val/accuracy",
        "value": values["val/accuracy"],
        "path": final.name,
        **{k: v for k, v in values.items() if k.startswith("val/")},
    }
    (root / f"{BEST}.json.tmp").write_text(json.dumps(record, indent=2))
    os.replace(root / f"{BEST}.json.tmp", root / f"{BEST}.json")
    for old in root.glob(f"{BEST}_*"):
        if old.is_dir() and old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final
