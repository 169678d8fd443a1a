"""``afctl bench lora``: the bytes of one weight sync with full fine-tuning and with
LoRA adapters, and the time to export, stage and load one, side by side in one
process on the same model (the tiny Qwen2 unless ``--model``).

Each sync is what a run does after a step: the trainer's ``export_weights``, the nng
sender's staging (``WeightsReady.num_bytes`` is the bytes on the wire) and the native
rollout engine's ``load_weights`` (for LoRA: the merge onto its base copy)."""

from __future__ import annotations

import json
import statistics
import time

import click


@click.command()
@click.option("--model", "model_dir", default=None, help="A Hugging Face model directory (default: the tiny Qwen2, built).")
@click.option("--rank", default=8, show_default=True, help="LoRA rank.")
@click.option("--targets", default="q_proj,k_proj,v_proj,o_proj", show_default=True, help="Adapted layers (comma separated).")
@click.option("--repeats", default=5, show_default=True, help="Syncs per mode, alternating (median reported).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def lora(model_dir: str | None, rank: int, targets: str, repeats: int, as_json: bool) -> None:
    """Bytes per weight sync and sync time, full weights vs LoRA adapters."""
    import tempfile

    import torch

    from asyncflow.actors.weights.nng import NngSender
    from asyncflow.engines.base import TokenBatch
    from asyncflow.engines.config import LoraConfig, RolloutEngineConfig, TrainEngineConfig
    from asyncflow.engines.factory import build_rollout_engine, build_train_engine

    if model_dir is None:
        from asyncflow.toy.tiny import make_tiny_model

        model_dir = str(make_tiny_model(tempfile.mkdtemp(prefix="af-bench-lora-"), arch="qwen2", seed=0))
    modes = {
        "full": TrainEngineConfig(lr=1e-3),
        "lora": TrainEngineConfig(
            lr=1e-2, lora=LoraConfig(rank=rank, alpha=2.0 * rank, target_modules=tuple(targets.split(",")))
        ),
    }
    ids = torch.randint(6, 90, (4, 16), generator=torch.Generator().manual_seed(0))
    batch = TokenBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=torch.ones(ids.shape))

    def nll(out, mb, ctx):
        return -(out.logp * mb.response_mask).sum() / ctx.num_tokens, {}

    engines = {name: build_train_engine(cfg, model_dir) for name, cfg in modes.items()}
    rollout = {name: build_rollout_engine(RolloutEngineConfig(), model_dir) for name in modes}
    senders = {name: NngSender(32 << 20) for name in modes}
    times: dict[str, list[float]] = {name: [] for name in modes}
    num_bytes: dict[str, int] = {}
    num_tensors: dict[str, int] = {}
    for version in range(1, repeats + 1):
        for name, engine in engines.items():  # alternating: both modes see the same machine load
            engine.train_step(batch, nll)
            t0 = time.perf_counter()
            snapshot = list(engine.export_weights())
            ready = senders[name].publish(version, snapshot, digest=0)
            rollout[name].load_weights(snapshot, version)
            times[name].append(time.perf_counter() - t0)
            num_bytes[name], num_tensors[name] = ready.num_bytes, len(snapshot)
    rows = [
        {"mode": name, "bytes": num_bytes[name], "tensors": num_tensors[name], "sync_s": round(statistics.median(times[name]), 5)}
        for name in modes
    ]
    click.echo(f"{'mode':<6} {'bytes':>10} {'tensors':>8} {'sync s':>9}")
    for r in rows:
        click.echo(f"{r['mode']:<6} {r['bytes']:>10} {r['tensors']:>8} {r['sync_s']:>9}")
    ratio = num_bytes["full"] / num_bytes["lora"]
    click.echo(f"LoRA rank {rank} on {targets}: {ratio:.1f}x fewer bytes per sync")
    if as_json:
        click.echo(json.dumps({"lora_sync": {"rows": rows, "bytes_ratio": round(ratio, 2), "rank": rank, "targets": targets}}))
