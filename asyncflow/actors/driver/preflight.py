"""Before launch: will the run fit in memory? Say so now, not as an OOM an hour in.
And (``check_inputs``) will its workers start: the reward functions and custom roles
import, the devices exist, the data has its fields, the model has a chat template.

The estimate counts what each process holds for the whole run: the trainer's model
states (weights, gradients, AdamW moments at the parameter dtype; twice with a PPO
critic), a reference copy of the weights, each rollout replica's weights and its
KV-cache budget, each reward-model replica's weights (and a judge's KV cache).
With LoRA (``train.engine.lora.rank > 0``) the trainer holds the weights of every
parameter (base + adapters) but gradients and AdamW moments of the trainable ones
only (adapters, + the norms with ``train_norms``), and a weight sync stages only
those (``planner.models.trainable_params``); a native replica also keeps the base
copy of each adapted weight, to merge each new adapter onto.
``estimate`` excludes activations (a lower bound); ``working_bytes`` adds, where the
data's prompt length is known (a launch), one micro-batch's activations and kept logits,
each process's runtime, a second staged snapshot and the evaluation engine: an estimate.
On cpu every process shares the host's memory, compared with MemAvailable; on
accelerators the per-device figures are printed for the user to compare with the
devices (or with `afctl plan`, which models activations too).

It also estimates a step's time (``step_estimate``), printed, and passed to the driver
so its stall timeout (``launcher.stall_timeout_s``) fits the model before the first
step: the FLOPs of a step (6 x parameters x tokens to train, x2 with a PPO critic;
2 x parameters x tokens to generate them, and for the reference's forward) over the
planner's figures for the device (``planner.hardware`` peak x ``planner.calibration``
efficiency; on cpu per core of the roles' threads, the peak read from this host's
/proc/cpuinfo: ``planner.io.local_cpu_peak``, bfloat16 where the trainer autocasts or the rollout
runs in it). What each role does in a step is its spec's ``step_work``; stages are
counted one after the other, as the first step runs them.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from asyncflow.actors.runtime.user_imports import importable
from asyncflow.config.load import ConfigError
from asyncflow.config.run import RunConfig
from asyncflow.engines import precision

if TYPE_CHECKING:
    from asyncflow.actors.runtime.spec import RoleSpec
    from asyncflow.planner.hardware import Hardware
    from asyncflow.planner.memory import MemoryFacts

_GIB = 1 << 30


def _available_host_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _facts(cfg: RunConfig, model_dir: str, reward_model_dir: str = "", prompt_tokens: float | None = None) -> MemoryFacts:
    from asyncflow.planner.io import from_hf_config
    from asyncflow.planner.memory import MemoryFacts

    shape = from_hf_config(Path(model_dir) / "config.json")
    rm = cfg.reward_model
    rm_params = 0
    if rm.enabled:
        rm_params = from_hf_config(Path(reward_model_dir) / "config.json").num_params if reward_model_dir else shape.num_params
    return MemoryFacts(shape=shape, reward_model_params=rm_params, prompt_tokens=prompt_tokens)


def _per_instance(cfg: RunConfig, facts: MemoryFacts, which: str) -> dict[str, float]:
    """``which`` (``memory`` or ``working_memory``) of every role instance the config
    starts, by the role's spec; the training group first."""
    from asyncflow.actors.driver.topology import BUILT_IN

    out = {}
    for spec in sorted(BUILT_IN, key=lambda s: not s.train_group):
        fn = getattr(spec, which)
        if fn is not None:
            for name in spec.instances(cfg):
                out[name] = float(fn(cfg, facts))
    return out


def estimate(cfg: RunConfig, model_dir: str, reward_model_dir: str = "") -> dict[str, float]:
    """Bytes of the states of each role instance that holds a model (lower bound: no
    activations; ``RoleSpec.memory``). ``reward_model_dir``: the reward-model role's
    model (empty: the policy's, which a judge without a path uses)."""
    return _per_instance(cfg, _facts(cfg, model_dir, reward_model_dir), "memory")


def working_bytes(cfg: RunConfig, model_dir: str, prompt_tokens: float) -> dict[str, float]:
    """What ``estimate`` leaves out, per role instance, at the run's sizes
    (``RoleSpec.working_memory``: the process's runtime, the trainer's activations and
    kept logits of one micro-batch, its staged snapshots and evaluation engine;
    ``planner/memory.py``). An estimate, not a bound."""
    return _per_instance(cfg, _facts(cfg, model_dir, prompt_tokens=prompt_tokens), "working_memory")


def check(cfg: RunConfig, model_dir: str, reward_model_dir: str = "", prompt_tokens: float | None = None) -> str:
    """One line to print; raises ConfigError when a cpu run cannot fit in host memory.
    With ``prompt_tokens`` (the data's mean prompt length) the figures include
    ``working_bytes`` (an estimate); without, they are the model states alone (a lower bound)."""
    per_role = estimate(cfg, model_dir, reward_model_dir)
    if prompt_tokens is not None:
        for role, extra in working_bytes(cfg, model_dir, prompt_tokens).items():
            per_role[role] = per_role.get(role, 0.0) + extra
    total = sum(per_role.values())
    detail = ", ".join(f"{k} {v / _GIB:.2f}" for k, v in per_role.items())
    if cfg.cluster.device == "cpu":
        available = _available_host_bytes()
        if available is not None and total > available:
            counted = "with one micro-batch's activations" if prompt_tokens is not None else "activations not counted"
            raise ConfigError(
                f"the run needs at least {total / _GIB:.1f} GiB of host memory ({detail} GiB, {counted}) "
                f"but {available / _GIB:.1f} GiB is available: use a smaller model, a smaller train.engine.micro_batch_size, fewer "
                f"rollout.num_replicas (or reward_model.num_replicas), a smaller rollout.engine.kv_cache_bytes, or "
                "bfloat16 weights"
            )
        about = "about" if prompt_tokens is not None else "at least"
        if available is None:  # this system does not say (no /proc/meminfo)
            return f"memory: {about} {total / _GIB:.2f} GiB ({detail} GiB)"
        return f"memory: {about} {total / _GIB:.2f} GiB of {available / _GIB:.1f} GiB available ({detail} GiB)"
    return f"memory per device, at least (activations not counted): {detail} GiB"


@functools.lru_cache(maxsize=2)
def _tokenizer_at(path: str):
    from asyncflow.engines.tokenizer import load_tokenizer  # the loader's: prompts are encoded as it encodes them

    return load_tokenizer(path)


def _tokenizer(model_dir: str):
    """The model's tokenizer, loaded once for the input check and the step estimate."""
    return _tokenizer_at(os.path.abspath(model_dir))


# -- a step's time ------------------------------------------------------------------------


class StepEstimate(NamedTuple):
    seconds: float
    """The first step's time: generation, reference forward and training one after the other."""
    line: str
    """What the preflight prints."""


_GPU_NAMES = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"))


def _hardware(cfg: RunConfig) -> tuple[Hardware, str]:
    """The planner's figures for the run's device, and what was assumed to pick them."""
    from asyncflow.planner.hardware import get_hardware

    if cfg.cluster.device == "cpu":
        return get_hardware("cpu"), "the planner's cpu figures"
    if cfg.cluster.device == "npu":
        return get_hardware("910b"), "the planner's Ascend 910B figures"
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    for marker, key in _GPU_NAMES:
        if marker in name:
            return get_hardware(key), f"the planner's {key.upper()} figures"
    return get_hardware("a100"), f"assuming an A100 ({name or 'no GPU seen here'})"


def step_estimate(cfg: RunConfig, model_dir: str, prompt_tokens: float) -> StepEstimate:
    """A step's time from its FLOPs (module docstring); ``prompt_tokens``: the mean prompt
    length in tokens (``mean_prompt_tokens``). Tokens of a step: prompts_per_step x
    group_size x (prompt + max_new_tokens), every response taken at its cap. What each
    role's instances do in a step is their spec's ``step_work`` (training, generation, a
    reference forward ...): the roles the config starts, counted one after the other."""
    from asyncflow.actors.driver.topology import BUILT_IN
    from asyncflow.planner.calibration import Efficiency
    from asyncflow.planner.io import from_hf_config, local_cpu_peak

    # what a token multiplies through: a mixture of experts' active parameters, not all of them
    params = from_hf_config(Path(model_dir) / "config.json").num_active_params
    seqs = cfg.train.prompts_per_step * cfg.algorithm.group_size
    tokens = seqs * (prompt_tokens + cfg.rollout.sampling.max_new_tokens)
    hw, source = _hardware(cfg)
    eff = Efficiency()
    efficiency = {"train": eff.train_flops, "prefill": eff.prefill_flops, "forward": eff.forward_flops}
    cpu = local_cpu_peak() if cfg.cluster.device == "cpu" else None  # this host's cores, not the profile's
    cores = (os.cpu_count() or 1) if cfg.cluster.device == "cpu" else 0  # a "device" of the cpu figures is one core
    unit = "core" if cores else "device"
    works = [spec.step_work(cfg, cores) for spec in BUILT_IN if spec.step_work is not None and spec.instances(cfg)]

    def peak(bfloat16: bool) -> float:
        if cpu is None:
            return hw.peak_bf16_flops
        return cpu.bf16_flops if bfloat16 else cpu.fp32_flops

    if cpu is not None:
        source = cpu.describe + (", bfloat16 training" if any(w.bfloat16 for w in works if w.efficiency == "train") else "")
    costs = [(w, w.flops_per_param_token * params * tokens, peak(w.bfloat16) * efficiency[w.efficiency]) for w in works]
    seconds = [flops / (w.units * rate) for w, flops, rate in costs]

    def units(n: int) -> str:
        return f"{n} {unit}{'s' if n > 1 else ''}"

    def secs(x: float) -> str:
        return f"{x:.0f} s" if x >= 10 else f"{x:.2g} s"

    def flop(x: float) -> str:
        return f"{x / 1e12:.2f} TFLOP" if x >= 1e11 else f"{x / 1e9:.3g} GFLOP"

    def rate(x: float) -> str:
        return f"{x / 1e12:.0f} TFLOP/s" if x >= 1e12 else f"{x / 1e9:.0f} GFLOP/s"

    total = sum(seconds)
    parts = ", ".join(f"{w.what} {flop(flops)} on {units(w.units)} {secs(t)}" for (w, flops, _), t in zip(costs, seconds))
    rates = {w.efficiency: (r, peak(w.bfloat16)) for w, _, r in costs}
    train_rate, train_peak = rates.get("train", (0.0, 0.0))
    generate_rate, generate_peak = rates.get("prefill", (0.0, 0.0))
    line = (
        f"step time: about {secs(total)} estimated ({parts}: "
        f"{seqs} sequences of ~{prompt_tokens:.0f} prompt + {cfg.rollout.sampling.max_new_tokens} new tokens, "
        f"{params / 1e6:.3g}M parameters)\n"
        f"  assuming ~{rate(train_rate)} per {unit} training, ~{rate(generate_rate)} generating ({source}: "
        f"{rate(train_peak)} / {rate(generate_peak)} peak x efficiency {eff.train_flops:g} / {eff.prefill_flops:g}); "
        "calibrated: afctl profile --out P, then afctl plan --config CONFIG --profile P"
    )
    notes = [precision_line(cfg), emulated_bf16_warning(cfg) if cpu is not None else None]
    return StepEstimate(total, line + "".join(f"\n  {note}" for note in notes if note))


def mean_prompt_tokens(cfg: RunConfig, data_path: str, tokenizer_dir: str, limit: int = 64) -> float:
    """Mean length in tokens of the data's first ``limit`` prompts, encoded as the loader
    does (through the chat template when ``data.chat_template``)."""
    from asyncflow.actors.runtime.run_dir import read_prompts
    from asyncflow.engines.prompts import prompt_ids

    if data_path.endswith(".jsonl"):  # the first lines only: the file may be large
        with open(data_path) as f:
            prompts = [str(json.loads(line)["prompt"]) for line, _ in zip((ln for ln in f if ln.strip()), range(limit))]
    else:
        prompts = [str(r["prompt"]) for r in read_prompts(data_path)[:limit]]
    tok = _tokenizer(tokenizer_dir)
    return sum(len(prompt_ids(tok, p, cfg.data.chat_template)) for p in prompts) / max(1, len(prompts))


def launch_step_estimate(cfg: RunConfig, model_dir: str, data_path: str, tokenizer_dir: str) -> StepEstimate:
    """``step_estimate`` of a launch, its prompts measured; 0 s (no estimate: the stall
    timeout is ``logging.hang_timeout_s``) with a line saying why where the prompts
    cannot be read or encoded here (the workers will say more)."""
    try:
        prompt_tokens = mean_prompt_tokens(cfg, data_path, tokenizer_dir)
    except (OSError, ValueError, KeyError) as exc:
        return StepEstimate(0.0, f"step time: not estimated (the prompts of {data_path}: {type(exc).__name__}: {exc})")
    return step_estimate(cfg, model_dir, prompt_tokens)


# -- inputs: what a worker would otherwise find out after the processes started ----------


TINY_MAX_POSITIONS = 512
"""``max_position_embeddings`` of the built-in tiny model (``toy/tiny.py``'s default)."""


def _positions(cfg: RunConfig) -> int | None:
    """The policy's ``max_position_embeddings`` (None when its config does not say)."""
    if not cfg.model.path:
        return TINY_MAX_POSITIONS
    from asyncflow.planner.io import read_hf_config

    positions = read_hf_config(cfg.model.path).get("max_position_embeddings")  # the text model's (Gemma 3, GPT-2 too)
    return positions if isinstance(positions, int) else None


def _check_length(cfg: RunConfig) -> None:
    """``max_new_tokens`` fits the model's positions with at least a one-token prompt
    (the engines refuse it only once their processes run, a minute later)."""
    positions = _positions(cfg)
    new = cfg.rollout.sampling.max_new_tokens
    if positions is not None and new >= positions:
        raise ConfigError(
            f"rollout.sampling.max_new_tokens = {new}: the model holds {positions} positions "
            f"(max_position_embeddings), prompt included; use at most {positions - 1} less the longest prompt's tokens"
        )


@functools.lru_cache(maxsize=1)
def _tiny_tokenizer():
    """The built-in tiny model's tokenizer as its loader will read it (saved, then loaded
    as from the model directory), before the model is built."""
    import tempfile

    from asyncflow.engines.tokenizer import load_tokenizer
    from asyncflow.toy.tiny import build_char_tokenizer

    with tempfile.TemporaryDirectory(prefix="af-tiny-tokenizer-") as folder:
        build_char_tokenizer().save_pretrained(folder)
        return load_tokenizer(folder)


def _check_prompt_lengths(cfg: RunConfig, prompts: list[str], where: list[str], model_dir: str) -> None:
    """Every prompt, encoded as the loader does, leaves ``max_new_tokens`` within the
    model's positions (and is at most ``data.max_prompt_tokens`` when set): a longer one
    would fail its rollout replica at every try, a minute into the run. ``model_dir``
    empty: the built-in tiny model's, checked before it is built (and before the memory
    estimate, which an over-long prompt would otherwise make refuse the run for memory)."""
    from asyncflow.engines.prompts import prompt_ids

    positions, new = _positions(cfg), cfg.rollout.sampling.max_new_tokens
    limits = [(cfg.data.max_prompt_tokens, "data.max_prompt_tokens")] if cfg.data.max_prompt_tokens else []
    if positions is not None:
        limits.append((positions - new, f"max_position_embeddings {positions} less rollout.sampling.max_new_tokens {new}"))
    if not limits:
        return
    limit, why = min(limits)
    tok = _tokenizer(model_dir) if model_dir else _tiny_tokenizer()
    long = [(at, n) for at, p in zip(where, prompts) if (n := len(prompt_ids(tok, p, cfg.data.chat_template))) > limit]
    if long:
        shown = ", ".join(f"{at} ({n} tokens)" for at, n in long[:3]) + (f" and {len(long) - 3} more" if len(long) > 3 else "")
        raise ConfigError(
            f"data.path = {cfg.data.path!r}: {len(long)} prompt(s) longer than {limit} tokens ({why}): {shown}; "
            "shorten or drop them, or give fewer rollout.sampling.max_new_tokens"
        )


def check_inputs(cfg: RunConfig, roles: Sequence[RoleSpec] = ()) -> None:
    """Everything a worker process would fail on at start, checked in the driver before
    any process starts (and before the run directory is made); a ConfigError names
    the key and the fix. The built-in tiny model and task need no data or template check.
    ``roles``: the specs whose devices are checked (``topology.BUILT_IN``)."""
    from asyncflow.actors.trainer.sources import check_step_shape
    from asyncflow.algorithms.rewards import BUILTIN_REWARDS, load_reward_fn

    check_step_shape(cfg)  # a step has one shape, and its source says what it cannot do
    for i, name in enumerate(cfg.reward.functions):
        if name in BUILTIN_REWARDS:
            continue
        key = f"reward.functions[{i}] = {name!r}"
        if ":" not in name:
            raise ConfigError(
                f"{key}: use a built-in ({', '.join(sorted(BUILTIN_REWARDS))}) or a dotted path "
                "'package.module:function' (docs/your-model-and-data.md, 'Your reward')"
            )
        try:
            importable(name, cfg.cluster.python_path)
            load_reward_fn(name)  # its signature (the module is imported now)
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc}") from None
    if cfg.env.path:
        from asyncflow.envs.base import load_env_factory

        try:
            importable(cfg.env.path, cfg.cluster.python_path)  # imported now: the factory's module is loaded
            load_env_factory(cfg.env.path)  # makes one: it is an Environment
        except ValueError as exc:
            raise ConfigError(f"env.path = {cfg.env.path!r}: {exc}") from None
    for i, role in enumerate(cfg.roles):
        key = f"roles[{i}].cls = {role.cls!r}"
        try:
            cls = importable(role.cls, cfg.cluster.python_path)
        except ValueError as exc:
            raise ConfigError(f"{key} (role {role.name!r}): {exc}") from None
        from asyncflow.actors.roles.column_role import ColumnRole
        from asyncflow.core.actor import Actor
        from asyncflow.core.host import class_path

        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise ConfigError(
                f"{key} (role {role.name!r}): not an asyncflow Actor subclass; subclass "
                f"{class_path(ColumnRole)} (docs/custom-roles.md)"
            )
    _check_devices(cfg, roles)
    _check_causal_lms(cfg)
    _check_lora_targets(cfg)
    _check_length(cfg)
    data_path, model_dir = cfg.data.path, cfg.model.path
    if data_path:
        from asyncflow.actors.runtime.run_dir import read_prompts_located

        try:
            rows, where = read_prompts_located(data_path)
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"data.path = {data_path!r}: {exc} (fields: docs/your-model-and-data.md)") from None

    if cfg.data.chat_template and model_dir:
        if not getattr(_tokenizer(model_dir), "chat_template", None):
            raise ConfigError(
                f"data.chat_template = true, but the tokenizer of {model_dir} has no chat template: set "
                "data.chat_template = false (prompts go to the model as plain text), or give the tokenizer a "
                "template (tokenizer.chat_template = '...'; tokenizer.save_pretrained(model_dir))"
            )
    if data_path:  # encoded as the loader will, chat template included (checked above); no model.path: the tiny one's
        _check_prompt_lengths(cfg, [str(r["prompt"]) for r in rows], where, model_dir)


def _check_causal_lms(cfg: RunConfig) -> None:
    """The models that must be causal LMs are (``engines.hf.causal_lm_refusal`` of their
    config.json): the policy, and a judge reward model of its own; refused by their key."""
    from asyncflow.engines.hf import causal_lm_refusal

    rm = cfg.reward_model
    judge = rm.path if rm.enabled and rm.kind == "judge" else ""
    for key, path in (("model.path", cfg.model.path), ("reward_model.path", judge)):
        if not path:
            continue
        try:
            config = json.loads((Path(path) / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"{key} = {path!r}: its config.json cannot be read ({exc}); give a directory saved with save_pretrained"
            ) from None
        reason = causal_lm_refusal(config)
        if reason is not None:
            raise ConfigError(f"{key} = {path!r}: {reason} (which models train: docs/your-model-and-data.md)")


def _check_lora_targets(cfg: RunConfig) -> None:
    """With LoRA, ``lora.target_modules`` name linear layers of the policy's language model
    (the trainer would refuse it as it starts): the model is built on the meta device,
    names only, no weights read."""
    spec = cfg.train.engine.lora
    if not spec.rank or not cfg.model.path or cfg.train.engine.type != "torch":
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from asyncflow.engines.lora import target_refusal

    config = AutoConfig.from_pretrained(cfg.model.path, local_files_only=True)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config)
    reason = target_refusal(lm, spec.target_modules)
    if reason is not None:
        raise ConfigError(f"train.engine.lora.target_modules = {list(spec.target_modules)}: {reason}")


def _check_devices(cfg: RunConfig, roles: Sequence[RoleSpec]) -> None:
    """The devices of ``cluster.device`` and of every role the config starts (its spec's
    ``devices_used``), each refused by its key when this machine lacks it."""
    used: list[tuple[str, str]] = [("cluster.device", cfg.cluster.device)]
    used += [kv for role in roles if role.instances(cfg) for kv in role.devices_used(cfg) if kv not in used]
    kinds = {device for _, device in used}
    if "cuda" in kinds:
        import torch

        if not torch.cuda.is_available():
            key = next(k for k, d in used if d == "cuda")
            raise ConfigError(
                f"{key} = 'cuda', but torch sees no CUDA device here (torch {torch.__version__}, "
                "torch.cuda.is_available() is False): use 'cpu', or run on a machine with a GPU and a "
                "CUDA build of torch"
            )
    if "npu" in kinds:
        import importlib.util

        if importlib.util.find_spec("torch_npu") is None:
            key = next(k for k, d in used if d == "npu")
            raise ConfigError(
                f"{key} = 'npu', but torch_npu is not installed: use 'cpu', or install torch_npu on an Ascend machine (extra npu)"
            )


def emulated_bf16_warning(cfg: RunConfig) -> str | None:
    """A preflight line where the config asks for bfloat16 by name on a CPU that
    emulates it (``auto`` never does), naming the keys and the fix; None otherwise."""
    if cfg.cluster.device != "cpu" or precision.bf16_fast("cpu"):
        return None
    keys = []
    if cfg.train.engine.autocast == "bfloat16":
        keys.append('train.engine.autocast = "bfloat16"')
    if cfg.train.engine.dtype == "bfloat16":
        keys.append('train.engine.dtype = "bfloat16"')
    if cfg.rollout.engine.dtype == "bfloat16":
        keys.append('rollout.engine.dtype = "bfloat16"')
    if not keys:
        return None
    from asyncflow.planner.io import local_cpu_peak

    peak = local_cpu_peak()
    what = peak.describe if peak is not None else "this CPU"
    return (
        f"warning: {' and '.join(keys)} on a CPU without bfloat16 instructions ({what}): torch emulates them, "
        'several times slower than float32 here; set train.engine.autocast = "auto" (bfloat16 only where the CPU '
        'has avx512_bf16 or amx_bf16) or "off", and rollout.engine.dtype = "float32"'
    )


def precision_line(cfg: RunConfig) -> str | None:
    """What ``train.engine.autocast = "auto"`` takes on this host, for the preflight
    (the trainer resolves it again on its own host); None for the other settings."""
    eng = cfg.train.engine
    if eng.autocast != "auto":
        return None
    taken = precision.resolve_autocast("auto", eng.device)
    where = "cpu" if eng.device == "cpu" else eng.device
    if taken == "bfloat16":
        return f'train.engine.autocast = "auto": bfloat16 mixed precision ({where} runs bfloat16 natively)'
    return f'train.engine.autocast = "auto": float32 ({where} has no native bfloat16: emulated, it would be slower)'
