"""Before launch: will the run fit in memory? Say so now, not as an OOM an hour in.

The estimate counts what each process holds for the whole run: the trainer's model
states (weights, gradients, AdamW moments at the parameter dtype; twice with a PPO
critic), a reference copy of the weights, each rollout replica's weights and its
KV-cache budget. Activations are excluded (they depend on micro-batch sizes), so it
is a lower bound. On cpu every process shares the host's memory, compared with
MemAvailable; on accelerators the per-device figures are printed for the user to
compare with the devices (or with `afctl plan`, which models activations too).
"""

from __future__ import annotations

from pathlib import Path

from asyncflow.core.config import ConfigError, RunConfig

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_GIB = 1 << 30


def _available_host_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def estimate(cfg: RunConfig, model_dir: str) -> dict[str, float]:
    """Bytes per process role (lower bound: no activations)."""
    from asyncflow.planner.models import from_hf_config

    params = from_hf_config(Path(model_dir) / "config.json").num_params
    train_b = _DTYPE_BYTES[cfg.train.engine.dtype]
    rollout_b = _DTYPE_BYTES[cfg.rollout.engine.dtype]
    kv = cfg.rollout.engine.kv_cache_bytes or (64 << 20 if cfg.rollout.engine.kv_cache_fraction is None else 0)
    trainer = params * train_b * 4 * (2 if cfg.algorithm.name == "ppo" else 1)  # weights, grads, 2 Adam moments
    ranks = cfg.train.num_ranks  # FSDP2 shards that state over the ranks
    out = {"trainer": trainer / ranks + params * 4}  # + the host-staged snapshot published to rollout (fp32 on cpu)
    for r in range(1, ranks):
        out[f"trainer.{r}"] = trainer / ranks
    for i in range(cfg.rollout.num_replicas):
        out[f"rollout.{i}"] = params * rollout_b + kv + params * 4  # weights + KV budget + the staged next version
    if cfg.algorithm.kl_coef > 0:
        for i in range(cfg.reference.num_workers):
            out[f"reference.{i}"] = params * train_b
    return out


def check(cfg: RunConfig, model_dir: str) -> str:
    """One line to print; raises ConfigError when a cpu run cannot fit in host memory."""
    per_role = estimate(cfg, model_dir)
    total = sum(per_role.values())
    detail = ", ".join(f"{k} {v / _GIB:.2f}" for k, v in per_role.items())
    if cfg.cluster.device == "cpu":
        available = _available_host_bytes()
        if available is not None and total > available:
            raise ConfigError(
                f"the run needs at least {total / _GIB:.1f} GiB of host memory ({detail} GiB, activations not "
                f"counted) but {available / _GIB:.1f} GiB is available: use a smaller model, fewer "
                f"rollout.num_replicas, a smaller rollout.engine.kv_cache_bytes, or bfloat16 weights"
            )
        return f"memory: at least {total / _GIB:.2f} GiB of {available / _GIB:.1f} GiB available ({detail} GiB)"
    return f"memory per device, at least (activations not counted): {detail} GiB"
