"""The memory check before launch: a run that cannot fit is refused with the numbers."""

from __future__ import annotations

import json

import msgspec
import pytest

from asyncflow.actors.driver.preflight import check, estimate
from asyncflow.config.load import ConfigError, load_config_text


def _model_dir(tmp_path, hidden: int, layers: int, vocab: int):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": hidden,
                "intermediate_size": 4 * hidden,
                "num_hidden_layers": layers,
                "num_attention_heads": 8,
                "num_key_value_heads": 8,
                "vocab_size": vocab,
                "tie_word_embeddings": False,
            }
        )
    )
    return str(tmp_path)


def test_the_estimate_counts_model_states_replicas_and_the_kv_budget(tmp_path):
    model = _model_dir(tmp_path, hidden=64, layers=2, vocab=100)
    cfg = load_config_text("[rollout]\nnum_replicas = 2\n[rollout.engine]\nkv_cache_bytes = 1000000")
    per_role = estimate(cfg, model)
    assert set(per_role) == {"trainer", "rollout.0", "rollout.1"}
    params = (per_role["rollout.0"] - 1_000_000) / 8  # fp32 weights + fp32 staged copy
    assert per_role["trainer"] == pytest.approx(params * 20)  # 16 B/param of states + 4 of the staged snapshot
    assert "memory: at least" in check(cfg, model)
    dp = estimate(load_config_text("[train]\nnum_ranks = 2\n[train.engine]\nfsdp = true"), model)
    assert dp["trainer.1"] == pytest.approx(params * 8)  # half the states: FSDP2 shards them
    assert dp["trainer"] == pytest.approx(params * 12)  # its half + the full snapshot it publishes


def test_a_model_too_large_for_this_host_is_refused_before_launch(tmp_path):
    model = _model_dir(tmp_path, hidden=16384, layers=120, vocab=150000)  # a few hundred billion parameters
    cfg = load_config_text("")
    with pytest.raises(ConfigError, match=r"needs at least .* GiB of host memory .* use a smaller model"):
        check(cfg, model)
    gpu = msgspec.structs.replace(cfg, cluster=msgspec.structs.replace(cfg.cluster, device="cuda"))
    assert check(gpu, model).startswith("memory per device")


@pytest.mark.timeout(30)
def test_the_preflight_estimates_a_steps_time_from_its_flops_and_says_what_it_assumed(tmp_path, monkeypatch):
    from asyncflow.actors.driver.preflight import step_estimate
    from asyncflow.planner import io
    from asyncflow.planner.cpu_peak import parse_cpuinfo
    from asyncflow.planner.io import from_hf_config

    # an AVX2 core at 2.45 GHz, whatever this host is (tests/planner/test_cpu_peak.py: the host's own peak)
    monkeypatch.setattr(io, "local_cpu_peak", lambda path="": parse_cpuinfo("cpu MHz : 2450\nflags : fma avx2\n"))

    model = _model_dir(tmp_path, hidden=256, layers=4, vocab=1000)
    params = from_hf_config(tmp_path / "config.json").num_params
    text = "[algorithm]\ngroup_size = 8\n[train]\nprompts_per_step = 8\n[rollout.sampling]\nmax_new_tokens = 16\n"
    est = step_estimate(load_config_text(text), model, prompt_tokens=46.0)
    tokens = 8 * 8 * (46 + 16)
    per_core = 78.4e9  # 2 FMA units x 8 lanes x 2 FLOP x 2.45 GHz, x the planner's default efficiencies
    assert est.seconds == pytest.approx(6 * params * tokens / (per_core * 0.35) + 2 * params * tokens / (per_core * 0.45))
    assert est.line.startswith(f"step time: about {est.seconds:.2g} s estimated")
    assert "64 sequences of ~46 prompt + 16 new tokens" in est.line
    assert "assuming ~27 GFLOP/s per core training" in est.line and "afctl profile" in est.line
    ppo = step_estimate(load_config_text(text.replace("[algorithm]\n", "[algorithm]\nname = 'ppo'\n")), model, 46.0)
    assert ppo.seconds == pytest.approx(est.seconds + 6 * params * tokens / (per_core * 0.35))  # the critic trains too


@pytest.mark.timeout(30)
def test_a_step_estimate_without_readable_prompts_says_so_and_leaves_the_stall_timeout_alone(tmp_path):
    from asyncflow.actors.driver.preflight import launch_step_estimate

    model = _model_dir(tmp_path, hidden=64, layers=2, vocab=100)
    est = launch_step_estimate(load_config_text(""), model, str(tmp_path / "missing.jsonl"), model)
    assert est.seconds == 0.0
    assert est.line.startswith(f"step time: not estimated (the prompts of {tmp_path / 'missing.jsonl'}: FileNotFoundError")


def test_with_the_prompt_length_the_estimate_adds_activations_logits_runtime_and_the_eval_engine(tmp_path):
    from asyncflow.actors.driver.preflight import working_bytes
    from asyncflow.planner.memory import PROCESS_BYTES

    model = _model_dir(tmp_path, hidden=64, layers=2, vocab=50_000)
    small = working_bytes(load_config_text("[train.engine]\nmicro_batch_size = 4"), model, prompt_tokens=40.0)
    big = working_bytes(load_config_text("[train.engine]\nmicro_batch_size = 8"), model, prompt_tokens=40.0)
    longer = working_bytes(load_config_text("[train.engine]\nmicro_batch_size = 4"), model, prompt_tokens=80.0)
    assert PROCESS_BYTES < small["trainer"] < big["trainer"] and small["trainer"] < longer["trainer"]
    assert small["rollout.0"] == PROCESS_BYTES
    in_trainer = "[train.engine]\nmicro_batch_size = 4\n[eval]\nevery_steps = 5\nwhere = 'trainer'"
    with_eval = working_bytes(load_config_text(in_trainer), model, 40.0)
    assert with_eval["trainer"] > small["trainer"]  # the evaluation engine's weights and KV cache
    # in a process of its own (async mode's default), the trainer holds no evaluation engine: the evaluator does
    own = working_bytes(load_config_text("[train.engine]\nmicro_batch_size = 4\n[eval]\nevery_steps = 5"), model, 40.0)
    assert own["trainer"] == small["trainer"] and own["evaluator"] == PROCESS_BYTES
    cfg = load_config_text("")
    assert check(cfg, model, prompt_tokens=40.0).startswith("memory: about")
    assert check(cfg, model).startswith("memory: at least")
