"""``afctl bench peer``: TRL's GRPOTrainer, asyncflow sync and async on the same task."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import msgspec
import pytest

from asyncflow.bench.peer import DEFAULT_CONFIG, trl_spec, unsupported


@pytest.mark.timeout(30)
def test_the_peer_gets_the_configs_work_and_refuses_what_it_cannot_do(tmp_path):
    from asyncflow.config.load import load_config

    cfg = load_config(str(DEFAULT_CONFIG))
    assert unsupported(cfg) is None
    spec = trl_spec(cfg, steps=7, threads=2, out_dir=tmp_path)
    assert (spec["samples_per_step"], spec["group_size"], spec["max_new_tokens"]) == (128, 8, 6)
    assert (spec["lr"], spec["clip_low"], spec["clip_high"], spec["steps"]) == (
        cfg.train.engine.lr,
        cfg.algorithm.loss.clip_low,
        cfg.algorithm.loss.clip_high,
        7,
    )
    assert spec["reward_functions"] == ["asyncflow.toy.tasks:reward"]
    # [eval]: TRL trains on the same split as asyncflow and its final weights get the same held-out evaluation
    assert (spec["heldout_prompts"], spec["data_seed"]) == (cfg.eval.num_prompts, cfg.data.seed) and cfg.eval.every_steps
    # TRL reads the training prompts in the loader's order: its seed (data.shuffle_seed) and shuffle
    assert (spec["shuffle"], spec["order_seed"]) == (cfg.data.shuffle, cfg.data.seed)
    reordered = msgspec.structs.replace(cfg, data=msgspec.structs.replace(cfg.data, order_seed=5))
    assert trl_spec(reordered, steps=7, threads=2, out_dir=tmp_path)["order_seed"] == 5
    no_eval = msgspec.structs.replace(cfg, eval=msgspec.structs.replace(cfg.eval, every_steps=0))
    assert trl_spec(no_eval, steps=7, threads=2, out_dir=tmp_path)["heldout_prompts"] == 0
    kl = msgspec.structs.replace(cfg, algorithm=msgspec.structs.replace(cfg.algorithm, kl_coef=0.1))
    assert "kl_coef = 0" in unsupported(kl)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_peer_runs_trls_two_paths_sync_and_async_for_a_few_steps_round_after_round(tmp_path):
    pytest.importorskip("trl", reason="the bench extra: pip install -e '.[bench]'")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncflow.cli.main",
            "bench",
            "peer",
            "--steps",
            "3",
            "--rounds",
            "2",
            "--json",
            "--keep-weights",
            "--out",
            str(tmp_path),
        ],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=580,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(line["systems"]) == {"trl", "trl_fast", "sync", "async"}
    assert line["systems"]["trl"]["trl_path"] == "default" and line["systems"]["trl_fast"]["trl_path"] == "fast"
    # asyncflow against each TRL path, and against the faster one: the comparison
    faster = line["trl_comparison"]
    assert faster == max(("trl", "trl_fast"), key=lambda t: line["systems"][t]["samples_per_s"])
    assert line["async_over_faster_trl"] == line[f"async_over_{faster}"] and "sync_over_trl_fast" in line
    assert "the comparison: " + faster in done.stdout
    for name, r in line["systems"].items():
        assert r["samples_per_s"] > 0 and 0.0 <= r["reward_last_10pct"] <= 1.0, (name, r)
        assert 0.0 <= r["heldout_accuracy"] <= 1.0, (name, r)  # examples/local.toml has [eval]
    assert line["systems"]["trl"]["steps"] == 3 and line["systems"]["trl_fast"]["steps"] == 3
    # two rounds side by side: each figure the median of the rounds', each ratio the median of the rounds' ratios
    assert line["rounds"] == 2 and {p.name for p in tmp_path.iterdir()} >= {"round-0", "round-1"}
    for r in line["systems"].values():
        assert len(r["samples_per_s_rounds"]) == 2 and r["samples_per_s"] == pytest.approx(sum(r["samples_per_s_rounds"]) / 2)
    assert len(line["async_over_trl_rounds"]) == 2
    # whether each asyncflow run pinned the trainer's core (examples/local.toml asks; only an idle machine gets it)
    assert [n in (0, 1) for n in line["systems"]["async"]["pinned_trainer_cores_rounds"]] == [True, True]
    assert line["systems"]["sync"]["pinned_trainer_cores_rounds"] == [0, 0]  # sync never pins
    assert line["async_over_trl"] == pytest.approx(sum(line["async_over_trl_rounds"]) / 2)
    for r in ("round-0", "round-1"):  # --keep-weights: each round's final weights are still there
        assert all((tmp_path / r / t / "final" / "config.json").is_file() for t in ("trl", "trl_fast"))
        assert all((tmp_path / r / mode / "checkpoints" / "latest").exists() for mode in ("sync", "async"))


@pytest.mark.timeout(30)
def test_trl_gets_the_rows_in_the_loaders_order_step_by_step_across_epochs():
    from asyncflow.actors.runtime.run_dir import PromptOrder
    from asyncflow.bench._peer_trl import in_asyncflows_order

    rows = [{"prompt": f"p{i}"} for i in range(10)]
    spec = {"samples_per_step": 12, "group_size": 4, "steps": 5, "shuffle": True, "order_seed": 3}
    got = [r["prompt"] for r in in_asyncflows_order(rows, spec)]
    order = PromptOrder(10, 3, shuffle=True, seed=3)  # the loader's: 3 groups a step
    assert got == [f"p{order.index(s, g)}" for s in range(5) for g in range(3)]
    assert len(got) == 15 and len(set(got[:10])) == 10  # 15 positions: one whole epoch, then the next one's start
    assert got != [r["prompt"] for r in in_asyncflows_order(rows, {**spec, "order_seed": 4})]
    assert [r["prompt"] for r in in_asyncflows_order(rows, {**spec, "shuffle": False})] == [f"p{i % 10}" for i in range(15)]


@pytest.mark.timeout(30)
def test_drop_weights_deletes_only_the_final_weights_and_counts_their_bytes(tmp_path):
    from asyncflow.bench.peer import drop_weights

    kept = ["trl.log", "trl/trainer_state.json", "async/metrics.jsonl", "async/logs/trainer.log", "sync/summary.json"]
    gone = {"trl/final/model.safetensors": 3000, "async/checkpoints/step_000003/model.safetensors": 5000}
    gone["async/checkpoints/step_000003/optimizer.pt"] = 700
    gone["trl_fast/final/model.safetensors"] = 1000  # TRL's fast path's
    for rel in kept:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    for rel, size in gone.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"\0" * size)
    (tmp_path / "async" / "checkpoints" / "latest").symlink_to("step_000003")  # as the trainer writes it
    assert drop_weights(tmp_path) == 9700  # the files once each, not again through the link
    assert all((tmp_path / rel).is_file() for rel in kept)
    assert not (tmp_path / "trl" / "final").exists() and not (tmp_path / "async" / "checkpoints").exists()
    assert not (tmp_path / "trl_fast" / "final").exists()
    assert drop_weights(tmp_path) == 0  # nothing left to delete; sync, that has no checkpoints, is no error


@pytest.mark.timeout(60)
def test_skip_sync_refuses_only_trl_which_already_skips_it():
    from click.testing import CliRunner

    from asyncflow.bench.peer import peer

    done = CliRunner().invoke(peer, ["--skip-sync", "--only-trl", "--steps", "1"])
    assert done.exit_code == 2 and "--only-trl already skips sync" in done.output, done.output


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_peer_skip_sync_runs_trl_and_async_and_evaluates_both(tmp_path):
    pytest.importorskip("trl", reason="the bench extra: pip install -e '.[bench]'")
    done = subprocess.run(
        [sys.executable, "-m", "asyncflow.cli.main", "bench", "peer", "--steps", "2", "--skip-sync", "--json"]
        + ["--trl-path", "default"]
        + ["--set", "data.order_seed=3", "--out", str(tmp_path)],
        # torch's huge pages, which every process inherits; the JSON line says so (the renderer splits by it)
        env=dict(os.environ, OMP_NUM_THREADS="1", THP_MEM_ALLOC_ENABLE="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=580,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(line["systems"]) == {"trl", "async"} and "sync_over_trl" not in line  # --trl-path default: one path
    assert line["trl_comparison"] == "trl" and line["async_over_faster_trl"] == line["async_over_trl"]
    assert line["huge_pages"] is True
    # TRL's final weights get the held-out evaluation from the async run's directory (no sync run to read it from)
    for name, r in line["systems"].items():
        assert 0.0 <= r["heldout_accuracy"] <= 1.0, (name, r)
    assert not (tmp_path / "sync").exists()
    # the weights both ended with are deleted once evaluated (no --keep-weights); the runs' records stay
    assert not (tmp_path / "trl" / "final").exists() and not (tmp_path / "async" / "checkpoints").exists()
    assert (tmp_path / "async" / "metrics.jsonl").is_file() and (tmp_path / "trl.log").is_file()
    assert "deleted the runs' final weights" in done.stdout
    # both trained on the same prompts at every step: TRL's reward calls against the groups async trained
    # (group g of the queue is group g % P of step g // P in the loader's order, data.order_seed 3)
    from asyncflow.actors.runtime.run_dir import PromptOrder, Run, read_prompts, split_prompts

    run = Run(str(tmp_path / "async"))
    rows = read_prompts(run.launch.data_path)
    train, _ = split_prompts([r["prompt"] for r in rows], run.config.eval.num_prompts, run.config.data.seed)
    per_step = run.config.train.prompts_per_step
    order = PromptOrder(len(train), per_step, shuffle=True, seed=3)
    groups = [sorted(set(json.loads(x)["groups"])) for x in (tmp_path / "async" / "trained.jsonl").read_text().splitlines()]
    assert [len(g) for g in groups] == [per_step, per_step]  # a step's prompts: per_step groups
    # (as sets: examples/local.toml's data repeats prompt texts, 100 distinct in 2,000 rows, so a step may hold one twice)
    trained = [{rows[train[order.index(*divmod(g, per_step))]]["prompt"] for g in step} for step in groups]
    assert [set(p) for p in line["systems"]["trl"]["prompts_by_step"]] == trained
    # and each step's reward of both, step by step (the figures a paired comparison reads)
    assert [len(r["reward_by_step"]) for r in line["systems"].values()] == [2, 2]
    seed0 = PromptOrder(len(train), per_step, shuffle=True, seed=0)
    assert trained[0] != {rows[train[seed0.index(0, g)]]["prompt"] for g in range(per_step)}  # order_seed took effect


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_trl_trains_at_asyncflows_lr_at_every_step(tmp_path):
    """The same lr at every step, warmup included: Hugging Face's warmup starts at 0 (its first step
    does not move the weights), asyncflow's at lr / W (engines/lr_schedule.py); TRL is given asyncflow's."""
    pytest.importorskip("trl", reason="the bench extra: pip install -e '.[bench]'")
    from asyncflow.config.load import load_config
    from asyncflow.engines.lr_schedule import lr_at

    done = subprocess.run(
        [sys.executable, "-m", "asyncflow.cli.main", "bench", "peer", "--steps", "4"]
        + ["--only-trl", "--set", "train.engine.lr_warmup_steps=2", "--set", "train.engine.lr_schedule=cosine"]
        + ["--json", "--out", str(tmp_path / "out")],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=580,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    eng = load_config(str(DEFAULT_CONFIG)).train.engine
    eng = msgspec.structs.replace(eng, lr_warmup_steps=2, lr_schedule="cosine")
    for trl in ("trl", "trl_fast"):  # both of TRL's paths
        assert line["systems"][trl]["lrs"] == pytest.approx([lr_at(eng, k, 4) for k in range(4)], rel=1e-6)
        assert line["systems"][trl]["lrs"][0] > 0


@pytest.mark.timeout(30)
def test_asyncflow_is_reported_against_each_trl_path_and_the_faster_is_the_comparison():
    from asyncflow.bench.peer import _medians, ratios

    def round_(trl: float, trl_fast: float, sync: float, async_: float) -> dict[str, dict]:
        figures = {"trl": trl, "trl_fast": trl_fast, "sync": sync, "async": async_}
        return {name: {"samples_per_s": x} for name, x in figures.items()}

    each = [round_(1.0, 2.0, 3.0, 4.0), round_(1.0, 4.0, 3.0, 6.0), round_(2.0, 3.0, 3.0, 6.0)]
    got = ratios(each, _medians(each))
    assert got["trl_comparison"] == "trl_fast"  # median samples/s 3.0 against TRL default's 1.0
    assert got["async_over_trl_rounds"] == [4.0, 6.0, 3.0] and got["async_over_trl"] == 4.0
    assert got["async_over_trl_fast_rounds"] == [2.0, 1.5, 2.0] and got["async_over_trl_fast"] == 2.0
    assert got["sync_over_trl_fast"] == 1.0 and got["sync_over_trl"] == 3.0
    assert (got["async_over_faster_trl"], got["sync_over_faster_trl"]) == (2.0, 1.0)
    # where TRL's default path was the faster one, it is the comparison
    slow_fast = [round_(2.0, 1.0, 3.0, 4.0)]
    assert ratios(slow_fast, _medians(slow_fast))["async_over_faster_trl"] == 2.0
    # one path only (--trl-path), or none (--skip-trl)
    one = [{k: v for k, v in round_(1.0, 2.0, 3.0, 4.0).items() if k != "trl_fast"}]
    assert ratios(one, _medians(one))["trl_comparison"] == "trl" and "async_over_trl_fast" not in ratios(one, _medians(one))
    none = [{k: v for k, v in round_(1.0, 2.0, 3.0, 4.0).items() if not k.startswith("trl")}]
    assert ratios(none, _medians(none)) == {}


@pytest.mark.timeout(30)
def test_each_trl_path_gets_its_name_in_the_spec(tmp_path):
    from asyncflow.config.load import load_config

    cfg = load_config(str(DEFAULT_CONFIG))
    assert trl_spec(cfg, steps=1, threads=1, out_dir=tmp_path)["trl_path"] == "default"
    assert trl_spec(cfg, steps=1, threads=1, out_dir=tmp_path, path="fast")["trl_path"] == "fast"


@pytest.mark.timeout(300)  # about 20 s on an idle machine, 96 s at a load of 15 on 2 cores
def test_trls_fast_path_is_built_accepted_by_trl_and_trains_a_step(tmp_path):
    """The fast path's GRPOConfig keys (bench/_peer_trl.py path_args) pass TRL's own checks,
    its trainer generates and trains a step with them on the tiny model, and TRL's config
    holds them as given."""
    pytest.importorskip("trl", reason="the bench extra: pip install -e '.[bench]'")
    from asyncflow.actors.runtime.run_dir import encode_prompt, read_prompts
    from asyncflow.bench._peer_trl import path_args
    from asyncflow.bench.shared_inputs import with_shared_inputs
    from asyncflow.config.load import load_config
    from asyncflow.engines.hf import load_tokenizer

    cfg = with_shared_inputs(load_config(str(DEFAULT_CONFIG), ["eval.every_steps=0"]), tmp_path)
    spec = trl_spec(cfg, steps=1, threads=1, out_dir=tmp_path / "trl_fast", path="fast")
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, "-m", "asyncflow.bench._peer_trl", str(tmp_path / "spec.json")],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=290,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    got = json.loads([x for x in done.stdout.splitlines() if x.startswith('{"trl"')][-1])["trl"]
    assert got["trl_path"] == "fast" and got["steps"] == 1 and got["samples_per_s"] > 0
    assert got["bf16"] is False  # TRL's continuous batching runs in float32 here (bench/_peer_trl.py path_args)
    tokenizer = load_tokenizer(cfg.model.path)
    longest = max(len(encode_prompt(tokenizer, str(r["prompt"]), cfg.data.chat_template)) for r in read_prompts(cfg.data.path))
    asked = path_args("fast", spec, longest)
    assert asked and got["generation"] == asked
    assert path_args("default", spec, longest) == {}
