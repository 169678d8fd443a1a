"""Every measurement behind the results pages, as data: its command, its seeds, the page
that shows it and the keys of its JSON that the page's template reads.

A command is one line: ``{work}`` is where its runs go (``--work``), ``{seeds}`` the
record's seeds in one invocation, ``{seed}`` one seed: such a record runs once per seed
and its JSON (docs/data/<name>.json) holds ``runs``, one entry per seed, each with the
command and date of its own invocation. ``keys`` are dotted paths into ``result`` (of each
seed's entry for a per-seed record; a list's items share the list's path).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "docs" / "data"
PAGES = {"results": "docs/results.md", "performance": "docs/performance.md", "real-model": "docs/real-model.md"}
"""Each page's template is scripts/pages/<name>.md."""


@dataclass(frozen=True)
class Record:
    name: str
    page: str
    """The page that shows it; "log": only docs/log/ does (its last figures, as rendered then)."""
    command: str
    seeds: tuple[int, ...] = ()
    keys: tuple[str, ...] = ()
    when_named: bool = False
    """Measured only when ``--only`` names it (hours, or a model to import first)."""

    @property
    def per_seed(self) -> bool:
        return "{seed}" in self.command


AF = "python -m asyncflow.cli.main"
PEER = f"{AF} bench peer --config examples/smollm2.toml --steps 10"
SEEDED = "--set seed={seed} --set rollout.engine.seed={seed}"
PAIRED = f"{PEER} {SEEDED} --set data.order_seed={{seed}}"
TAIL = "--skip-sync --trl-threads 2 --json --out {work}/{name}/seed{seed}"
STREAMED = "--set workflow.staleness=0 --set workflow.stream_step=true --set rollout.prompts_per_call=2"
DECOUPLED = "--set algorithm.clip_against=proximal --set train.engine.share_prompts=true"
ONE_ASYNC = "python scripts/real_model_check.py --seeds {seeds} --modes async"
GROUP_ROLLOUT = (
    f"{AF} bench rollout --model models/smollm2-135m --num-prompts 8 --samples-per-prompt 8 --batch-size 64 "
    "--max-new-tokens 24 --repeats 3"
)
GEMMA3_ROLLOUT = (
    f"{AF} bench rollout --model models/gemma3-270m --task add1 --num-prompts 8 --samples-per-prompt 8 "
    "--batch-size 64 --max-new-tokens 16 --repeats 3"
)
GEMMA3_STOPS = ",".join(
    str(t) for t in tomllib.loads((ROOT / "examples/gemma3.toml").read_text())["rollout"]["sampling"]["stop_token_ids"]
)
LEARNING = ("real_model.seeds", "real_model.target", "real_model.async.val_start_accuracy",
            "real_model.async.val_final_accuracy", "real_model.async.val_best_accuracy", "real_model.async.wall_s",
            "real_model.async.samples_per_s", "real_model.async.met_target")  # fmt: skip
ROLLOUT = ("tokens_per_s", "baseline_tokens_per_s", "ratio", "baseline", "threads", "dtype")
PAIRED_KEYS = ("systems.trl.heldout_accuracy", "systems.async.heldout_accuracy", "systems.trl.samples_per_s",
               "systems.async.samples_per_s")  # fmt: skip
PEER_KEYS = ("systems.trl.samples_per_s", "systems.sync.samples_per_s", "systems.async.samples_per_s",
             "systems.trl.heldout_accuracy", "systems.sync.heldout_accuracy", "systems.async.heldout_accuracy",
             "systems.trl.threads")  # fmt: skip
PATHS_KEYS = ("systems.trl.samples_per_s", "systems.trl_fast.samples_per_s", "systems.async.samples_per_s",
              "systems.trl.heldout_accuracy", "systems.trl_fast.heldout_accuracy", "systems.async.heldout_accuracy",
              "systems.trl_fast.generation", "trl_comparison", "async_over_faster_trl")  # fmt: skip
SEEDS_10 = tuple(range(10))


def _r(name: str, page: str, command: str, **kw) -> Record:
    return Record(name, page, command.replace("{name}", name), **kw)


RECORDS = [
    # docs/results.md: the tiny model the project builds itself
    _r("parity", "results", "python scripts/convergence_parity.py --seeds {seeds} --out {work}/parity", seeds=(0, 1, 2),
       keys=("parity.seeds", "parity.sync.reward_last_10pct", "parity.async.reward_last_10pct",
             "parity.sync.samples_per_s", "parity.async.samples_per_s", "parity.sync.val_final_accuracy",
             "parity.async.val_final_accuracy")),
    _r("parity_stream", "results", "python scripts/convergence_parity.py --seeds {seeds} --modes async "
       "--set workflow.staleness=0 --set workflow.stream_step=true --set rollout.prompts_per_call=4 "
       "--set train.engine.micro_batch_size=32 --out {work}/parity_stream", seeds=(0, 1, 2),
       keys=("parity.async.reward_last_10pct_mean", "parity.async.samples_per_s")),
    _r("objective", "results", "python scripts/convergence_parity.py --seeds {seeds} --modes async "
       "--set algorithm.clip_against=proximal --out {work}/objective", seeds=(0, 1, 2)),
    _r("e2e", "results", f"{AF} bench e2e --config examples/local.toml --steps 100 --json --out {{work}}/e2e"),
    _r("e2e_k2", "results", f"{AF} bench e2e --config examples/local.toml --steps 100 --staleness 2 --json --out {{work}}/e2e_k2"),
    _r("queue", "results", f"{AF} bench queue -B 8 -L 64 -n 300 --compare-inline --json"),
    _r("train", "results", f"{AF} bench train --json"),
    _r("packing", "results", f"{AF} bench train --packing --steps 10 --json"),
    _r("algorithms", "results", "python scripts/algorithms_check.py --seeds {seeds} --out {work}/algorithms",
       seeds=(0, 1, 2), keys=("algorithms.algorithms", "algorithms.config")),
    *(
        _r(f"dynamic_sampling{suffix}", "results", f"python scripts/dynamic_sampling_check.py --mode {mode} "
           f"--seeds {{seeds}} --out {{work}}/dynamic_sampling{suffix}", seeds=tuple(range(15)))
        for mode, suffix in (("async", ""), ("sync", "_sync"))
    ),
    _r("agent", "results", "python examples/agent/measure.py --out {work}/agent",
       keys=("agent.reward_first_10pct", "agent.reward_last_10pct", "agent.episodes", "trainer.sessions_trained")),
    # the same agent program on SmolLM2 (models/smollm2-135m): two-turn addition, paced, its discarded fraction
    _r("agent_smollm2", "results", "python examples/agent/measure.py --example smollm2 --out {work}/agent_smollm2",
       keys=("agent.reward_first_10pct", "agent.reward_last_10pct", "agent.episodes",
             "agent.first_turn_right_first_10pct", "agent.first_turn_right_last_10pct", "run.sessions_trained",
             "run.sessions_stale", "run.sessions_stale_frac", "run.staleness_mean"), when_named=True),
    _r("hub", "results", "python examples/hub/measure.py --out {work}/hub",
       keys=("reward_first_10pct", "reward_last_10pct", "steps")),
    _r("sticky", "results", "python scripts/bench_sticky.py --replicas 2,4 --json",
       keys=("runs.replicas", "runs.policy", "runs.prompt_tokens", "runs.reused_fraction", "runs.cached_fraction")),
    _r("twin", "results", "python scripts/twin_table.py --cases 7b:32,64,256,1024 32b:32,64,256,1024 --steps 5 "
       "--out {work}/twin --linearity 7b:64,1024 32b:64,1024 --linearity-batch 1024x16",
       keys=("cases.model", "cases.npus", "cases.speedup_async_over_colocated",
             "cases.predicted_speedup_async_over_colocated", "cases.wall_s", "cases.modes.sync.error",
             "cases.modes.async.error", "cases.modes.colocated.error", "cases.modes.async.rollout", "linearity.model",
             "linearity.npus", "linearity.batch", "linearity.linearity", "linearity.predicted_linearity",
             "linearity.wall_s")),
    _r("twin_32b_512", "results", f"{AF} twin --model 32b --npus 512 --hardware 910b --steps 6 --json --out {{work}}/twin_32b_512",
       keys=("modes.sync.error", "modes.async.error", "modes.colocated.error", "speedup_async_over_colocated",
             "predicted_speedup_async_over_colocated", "modes.async.overhead_frac_real_total"), when_named=True),
    _r("planner_rounds", "results", f"{AF} bench planner --rounds 6 --json --out {{work}}/planner_rounds",
       keys=("ratios",)),
    _r("fanout", "results", f"{AF} bench fanout --replicas 2,8,32,128 --mb 16 --versions 3 --json",
       keys=("rows.replicas", "rows.fanout", "rows.trainer_copies_per_version", "rows.trainer_cpu_s",
             "rows.last_replica_s")),
    _r("fanout_link", "results", f"{AF} bench fanout --replicas 2,8,32,128 --mb 4 --link-mb-s 25 --versions 3 --json",
       keys=("rows.replicas", "rows.fanout", "rows.last_replica_s")),
    # docs/performance.md
    _r("peer", "performance", f"{AF} bench peer --steps 300 --rounds 3 --json --out {{work}}/peer"),
    _r("breakdown", "performance", f"{AF} bench e2e --config examples/local.toml --steps 100 --breakdown --json "
       "--out {work}/breakdown"),
    _r("real_breakdown", "performance", f"{AF} bench e2e --config examples/smollm2.toml --steps 6 "
       "--set eval.every_steps=0 --set eval.at_start=false --breakdown --json --out {work}/real_breakdown",
       keys=("breakdown", "sync_ms_per_step", "async_ms_per_step", "ratio"), when_named=True),
    _r("real_decode", "performance", f"{AF} bench decode --model models/smollm2-135m --rows 8,64,256 --context 80 "
       "--steps 10 --threads 1 --json", when_named=True,
       keys=("rows.rows", "rows.eager_ms", "rows.compiled_ms", "rows.speedup", "rows.compile_s", "rows.graph_rows",
             "rows.graph_keys", "rows.max_logp_gap", "rows.same_greedy", "recompiles", "context", "threads")),
    # the example's trainer against the bfloat16 matmul peak, and against its former settings side by side
    _r("real_train_peak", "performance", f"{AF} bench train --config examples/smollm2.toml --prompt-len 46 --steps 5 "
       "--baseline micro_batch_tokens=0 --baseline logit_chunk=0 --baseline attention=sdpa", when_named=True,
       keys=("rows", "real_tokens", "threads", "autocast", "micro_batch_tokens", "logit_chunk", "step_s", "train_tflops",
             "bfloat16_peak_tflops", "of_bfloat16_peak", "ideal_step_s", "profiled_step_s", "places.place",
             "places.seconds", "places.of_step", "baseline_step_s", "speedup_over_baseline", "baseline_of_bfloat16_peak",
             "step_seconds", "baseline_step_seconds", "steps",
             "load_average")),
    # docs/real-model.md: SmolLM2-135M (models/smollm2-135m) and Gemma 3 270M (models/gemma3-270m), imported first
    _r("real_model", "real-model", "python scripts/real_model_check.py --seeds {seeds} --modes async sync "
       "--out {work}/real_model", seeds=(0, 1), keys=(*LEARNING, *(k.replace(".async.", ".sync.") for k in LEARNING[2:])),
       when_named=True),
    _r("gemma3_model", "real-model", "python scripts/real_model_check.py --config examples/gemma3.toml "
       "--seeds {seeds} --modes async --out {work}/gemma3_model", seeds=(0, 1), keys=LEARNING, when_named=True),
    _r("gemma3_rollout", "real-model", f"{GEMMA3_ROLLOUT} --stop-token-ids {GEMMA3_STOPS} --json", keys=ROLLOUT,
       when_named=True),
    _r("gemma3_rollout_eos", "log", f"{GEMMA3_ROLLOUT} --profile --json", when_named=True),
    _r("real_lora_learning", "real-model", f"{ONE_ASYNC} --set train.engine.lora.rank=8 --set train.engine.lr=2e-4 "
       "--out {work}/real_lora_learning", seeds=(0,), keys=LEARNING, when_named=True),
    _r("real_algorithms", "real-model", "python scripts/algorithms_check.py --config examples/smollm2.toml "
       "--rollout-seed --only GRPO GSPO CISPO 'Dr. GRPO' RLOO REINFORCE++ --seeds {seeds} --out {work}/real_algorithms",
       seeds=(0, 1, 2), keys=("algorithms.algorithms", "algorithms.config"), when_named=True),
    _r("real_rollout", "real-model", f"{GROUP_ROLLOUT} --profile --json", keys=ROLLOUT, when_named=True),
    _r("real_rollout_bf16", "real-model", f"{GROUP_ROLLOUT} --dtype bfloat16 --json", keys=ROLLOUT, when_named=True),
    _r("real_rollout_distinct", "real-model", f"{AF} bench rollout --model models/smollm2-135m --num-prompts 64 "
       "--batch-size 64 --max-new-tokens 24 --repeats 3 --json", keys=ROLLOUT, when_named=True),
    _r("real_prefix", "real-model", f"{AF} bench prefix --model models/smollm2-135m --repeats 3 --json",
       keys=("seconds_cache", "seconds_no_cache", "speedup", "conversations", "turns"), when_named=True),
    _r("real_bf16_learning", "log", f"{ONE_ASYNC} --set rollout.engine.dtype=bfloat16 --out {{work}}/{{name}}",
       seeds=(0,), when_named=True),
    _r("real_fp32_learning", "log", f"{ONE_ASYNC} --set train.engine.autocast=off --out {{work}}/{{name}}",
       seeds=(0,), when_named=True),
    _r("real_model_here", "log", f"{ONE_ASYNC} --out {{work}}/{{name}}", seeds=(0,), when_named=True),
    _r("real_eval_placement", "real-model", "python scripts/eval_placement.py --config examples/smollm2.toml --reps 2 "
       "--out {work}/{name}", keys=("eval_placement.reps", "eval_placement.trainer.wall_mean_s", "eval_placement.process.wall_mean_s",
       "eval_placement.saving", "eval_placement.same_accuracy"), when_named=True),
    _r("real_train", "real-model", f"{AF} bench train --model models/smollm2-135m --num-rows 16 --seq-len 64 "
       "--micro-batch-size 8 --steps 2 --autocast --json", when_named=True,
       keys=("tokens_per_s", "autocast_tokens_per_s", "ratio_autocast_to_float32", "fsdp2_tokens_per_s",
             "one_process_threads", "train_tflops", "float32_peak_tflops", "of_float32_peak", "autocast_tflops",
             "bfloat16_peak_tflops", "of_bfloat16_peak")),
    _r("real_share_prompts", "real-model", f"{AF} bench train --model models/smollm2-135m --share-prompts "
       "--num-rows 64 --group-size 8 --prompt-len 46 --seq-len 62 --micro-batch-size 16 --autocast --threads 2 "
       "--steps 3 --json", keys=("ratio_shared_to_whole", "max_loss_diff"), when_named=True),
    _r("real_lora", "real-model", f"{AF} bench lora --model models/smollm2-135m --rank 8 --repeats 3 --json",
       keys=("lora_sync.bytes_ratio", "lora_sync.rank"), when_named=True),
    _r("real_peer_here", "real-model", f"{PEER} --trl-threads 2 --json --out {{work}}/real_peer_here",
       keys=PEER_KEYS, when_named=True),
    _r("real_peer_prox", "real-model", f"{PEER} {DECOUPLED} --trl-threads 2 --json --out {{work}}/real_peer_prox",
       keys=PEER_KEYS, when_named=True),
    # TRL's default path and its fastest without vLLM (bench/_peer_trl.py path_args), async against each
    _r("real_peer_paths", "real-model", f"{PEER} --skip-sync --trl-threads 2 --json --out {{work}}/real_peer_paths",
       keys=PATHS_KEYS, when_named=True),
    _r("real_peer_trl2", "log", f"{PEER} --trl-threads 2 --only-trl --json --out {{work}}/real_peer_trl2",
       when_named=True),
    # per seed: TRL and the example's async (and sync where the entry has it), held-out accuracy
    _r("real_peer", "log", f"{PEER} {SEEDED} --json --out {{work}}/{{name}}/seed{{seed}}", seeds=tuple(range(5)),
       when_named=True),
    _r("real_stream", "log", f"{PEER} {STREAMED} {SEEDED} --json --out {{work}}/{{name}}/seed{{seed}}",
       seeds=(0, 1, 2), when_named=True),
    _r("real_bf16", "log", f"{PEER} {SEEDED} --set rollout.engine.dtype=bfloat16 --skip-trl --skip-sync --json "
       "--out {work}/{name}/seed{seed}", seeds=tuple(range(5)), when_named=True),
    _r("real_hfconv", "log", f"{PEER} {SEEDED} --set train.engine.lr_schedule_convention=huggingface --skip-trl "
       "--skip-sync --json --out {work}/{name}/seed{seed}", seeds=tuple(range(5)), when_named=True),
    _r("real_trl_lr", "log", f"{PEER} {SEEDED} {TAIL}", seeds=SEEDS_10, keys=PAIRED_KEYS, when_named=True),
    # paired by data: TRL reads the prompts in asyncflow's order, and each seed draws another order for both
    _r("real_paired", "real-model", f"{PAIRED} {TAIL}", seeds=SEEDS_10, keys=PAIRED_KEYS, when_named=True),
    # the example as shipped against TRL's faster path on this CPU (real_peer_paths says which), 5 seeds declared
    # before they ran: held-out accuracy not worse beyond noise, samples/s at least 1.5x
    _r("real_paired_fair", "real-model", f"{PAIRED} --trl-path default {TAIL}", seeds=tuple(range(5)),
       keys=PAIRED_KEYS, when_named=True),
    _r("real_paired_prox", "real-model", f"{PAIRED} {DECOUPLED} {TAIL}", seeds=SEEDS_10, keys=PAIRED_KEYS,
       when_named=True),
    _r("real_paired_stream", "real-model", f"{PAIRED} {DECOUPLED} {STREAMED} {TAIL}", seeds=tuple(range(20)),
       keys=PAIRED_KEYS, when_named=True),
    _r("real_paired_fp32", "real-model", f"{PAIRED} {DECOUPLED} {STREAMED} --set train.engine.autocast=off {TAIL}",
       seeds=SEEDS_10, keys=PAIRED_KEYS, when_named=True),
]  # fmt: skip
BY_NAME = {r.name: r for r in RECORDS}
