"""What the vLLM adapter asks of vLLM (engines/vllm_requests.py), and the config rules
of its keys: checked without vLLM or a GPU."""

from types import SimpleNamespace

import pytest

from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
from asyncflow.engines.vllm_requests import (
    Boundary,
    engine_kwargs,
    finish_reason,
    memory_kwargs,
    sampled_logprobs,
    sampling_kwargs,
    token_prompt,
    token_versions,
    versions_from_boundaries,
    versions_from_spans,
    weight_transfer_backend,
)

pytestmark = pytest.mark.timeout(60)


def _span(start, end, version):
    return SimpleNamespace(start=start, end=end, version=version)


def test_auto_weight_transfer_is_ipc_on_one_gpu_and_rpc_with_tensor_parallelism_or_on_ascend():
    assert weight_transfer_backend(RolloutEngineConfig(type="vllm")) == "ipc"
    assert weight_transfer_backend(RolloutEngineConfig(type="vllm", tensor_parallel_size=2)) == "rpc"
    assert weight_transfer_backend(RolloutEngineConfig(type="vllm_ascend")) == "rpc"
    assert weight_transfer_backend(RolloutEngineConfig(type="vllm", weight_transfer="rpc")) == "rpc"


@pytest.mark.parametrize(
    "engine, message",
    [
        ('type = "native"\nweight_transfer = "ipc"', "rollout.engine.weight_transfer = 'ipc': only the vLLM engines"),
        ('type = "native"\npartial_kv = "recompute"', "rollout.engine.partial_kv = 'recompute': only the vLLM engines"),
        ('type = "vllm"\ntensor_parallel_size = 2\nweight_transfer = "ipc"', "use 'rpc'"),
        ('type = "vllm_ascend"\nweight_transfer = "ipc"', "CUDA IPC needs CUDA"),
    ],
)
def test_a_vllm_key_that_cannot_work_is_refused_naming_the_key_and_the_fix(engine, message):
    from asyncflow.config.load import ConfigError, load_config_text

    with pytest.raises(ConfigError) as info:
        load_config_text(f"[rollout.engine]\n{engine}\n")
    assert message in str(info.value)


def test_the_vllm_keys_load_where_they_apply():
    from asyncflow.config.load import load_config_text

    cfg = load_config_text(
        '[rollout.engine]\ntype = "vllm"\ntensor_parallel_size = 2\nweight_transfer = "rpc"\npartial_kv = "recompute"\n'
    )
    assert cfg.rollout.engine.weight_transfer == "rpc" and cfg.rollout.engine.partial_kv == "recompute"


def test_sampling_stops_only_on_the_listed_tokens_and_returns_the_sampled_logprob_as_token_ids():
    kw = sampling_kwargs(SamplingParams(n=4, temperature=0.7, top_k=0, max_new_tokens=9, stop_token_ids=(2, 5), seed=3))
    assert kw["stop_token_ids"] == [2, 5] and kw["ignore_eos"] is True  # eos is not a stop unless listed
    assert kw["logprobs"] == 0  # the sampled token's log-prob only
    assert kw["detokenize"] is False  # token ids out
    assert kw["top_k"] == -1 and kw["n"] == 4 and kw["max_tokens"] == 9 and kw["seed"] == 3
    assert sampling_kwargs(SamplingParams(top_k=5))["top_k"] == 5
    # vLLM refuses n > 1 with greedy sampling: one sample, repeated by the adapter
    assert sampling_kwargs(SamplingParams(n=4, temperature=0.0))["n"] == 1


def test_a_prompt_is_the_exact_token_ids_so_a_continuation_is_never_retokenised():
    turn1, response, observation = [4, 9, 16], [7, 7, 2], [30, 31]
    prompt = token_prompt(turn1 + response + observation)
    assert prompt == {"prompt_token_ids": [4, 9, 16, 7, 7, 2, 30, 31]}
    with pytest.raises(ValueError, match="at least one token"):
        token_prompt([])


def test_engine_arguments_load_no_tokenizer_cache_prefixes_and_take_the_kv_budget(tmp_path):
    kw = engine_kwargs(RolloutEngineConfig(type="vllm", kv_cache_bytes=2**30, max_batch_size=7), tmp_path, "m.Ext")
    assert kw["skip_tokenizer_init"] is True and kw["enable_prefix_caching"] is True
    assert kw["kv_cache_memory_bytes"] == 2**30 and "gpu_memory_utilization" not in kw
    assert kw["max_num_seqs"] == 7 and kw["worker_extension_cls"] == "m.Ext" and kw["model"] == str(tmp_path)
    assert kw["logprobs_mode"] == "processed_logprobs"
    assert memory_kwargs(RolloutEngineConfig(type="vllm", kv_cache_fraction=0.4)) == {"gpu_memory_utilization": 0.4}
    assert memory_kwargs(RolloutEngineConfig(type="vllm")) == {"gpu_memory_utilization": 0.85}


def test_finish_reason_and_logprobs_come_from_the_ids():
    assert finish_reason([5, 2], (2,)) == "stop"
    assert finish_reason([5, 6], (2,)) == "length"
    assert finish_reason([], (2,)) == "length"
    steps = [{5: SimpleNamespace(logprob=-0.5)}, {2: SimpleNamespace(logprob=-1.25)}]
    assert sampled_logprobs([5, 2], steps) == [-0.5, -1.25]
    with pytest.raises(RuntimeError, match="logprobs=0"):
        sampled_logprobs([5, 2], steps[:1])


def test_per_token_versions_follow_vllms_spans():
    spans = [_span(4, 6, "8"), _span(0, 4, "7")]  # any order
    assert versions_from_spans(6, spans, start_version=7) == [7, 7, 7, 7, 8, 8]
    # a span without a label changes nothing; one past the end is clipped
    assert versions_from_spans(3, [_span(0, 1, None), _span(1, 9, "5")], start_version=4) == [4, 5, 5]
    with pytest.raises(RuntimeError, match="not an asyncflow policy version"):
        versions_from_spans(2, [_span(0, 2, "step-3")], start_version=0)


def test_without_spans_per_token_versions_follow_the_recorded_swaps():
    boundaries = [Boundary(num_tokens=5, version=9), Boundary(num_tokens=2, version=8)]
    assert versions_from_boundaries(6, boundaries, start_version=7) == [7, 7, 8, 8, 8, 9]
    assert versions_from_boundaries(3, [Boundary(num_tokens=10, version=9)], start_version=7) == [7, 7, 7]
    assert token_versions(3, None, [Boundary(1, 2)], start_version=1) == [1, 2, 2]
    assert token_versions(3, [_span(0, 3, "4")], [Boundary(1, 2)], start_version=1) == [4, 4, 4]  # spans win
    assert token_versions(2, [], [], start_version=6) == [6, 6]


def _gpu_check_overrides() -> list[str]:
    """The ``--set`` items scripts/gpu_check.sh gives ``afctl up examples/gpu.toml``."""
    import re
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh").read_text()
    run = script[script.index('"$AFCTL" up examples/gpu.toml') :]
    run = run[: run.index("rc=$?")]
    return [quoted or bare for quoted, bare in re.findall(r"--set (?:'([^']*)'|(\S+))", run)]


def test_the_gpu_checks_run_of_examples_gpu_toml_is_a_valid_one_gpu_config_of_20_steps_on_vllm():
    from pathlib import Path

    from asyncflow.config.load import load_config

    overrides = _gpu_check_overrides()
    assert len(overrides) >= 10
    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "gpu.toml", overrides)
    assert cfg.train.num_steps == 20 and cfg.model.path == "" and cfg.data.path == ""
    assert cfg.rollout.engine.type == "vllm" and weight_transfer_backend(cfg.rollout.engine) == "ipc"
    assert cfg.rollout.devices == cfg.train.devices == cfg.reference.devices == [0]


def test_examples_npu_toml_takes_the_rpc_weight_path():
    from pathlib import Path

    from asyncflow.config.load import load_config

    cfg = load_config(
        Path(__file__).resolve().parents[2] / "examples" / "npu.toml",
        ['model.path=""', 'data.path=""', "data.chat_template=false"],
    )
    assert cfg.rollout.engine.type == "vllm_ascend" and weight_transfer_backend(cfg.rollout.engine) == "rpc"


@pytest.mark.gpu  # needs vllm installed (no GPU): scripts/gpu_check.sh runs it
def test_the_requests_build_vllms_own_objects(tmp_path):
    """Each dict here is accepted by the installed vLLM's own classes, and the weight
    source meets what vLLM's IPC trainer engine asks of one."""
    pytest.importorskip("vllm")
    import torch
    from vllm import AsyncEngineArgs
    from vllm import SamplingParams as VSamplingParams
    from vllm.config import WeightTransferConfig
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo
    from vllm.outputs import WeightVersionSpan

    from asyncflow.engines.vllm_rollout import WORKER_EXTENSION, _received_weights_source

    for params in (SamplingParams(n=4, stop_token_ids=(2,), seed=1), SamplingParams(n=4, temperature=0.0, top_k=5)):
        v = VSamplingParams(**sampling_kwargs(params))
        assert v.logprobs == 0 and v.detokenize is False and v.ignore_eos is True
    args = AsyncEngineArgs(
        **engine_kwargs(RolloutEngineConfig(type="vllm", kv_cache_fraction=0.3), tmp_path, WORKER_EXTENSION),
        weight_transfer_config=WeightTransferConfig(backend="ipc"),
    )
    assert args.skip_tokenizer_init is True and args.logprobs_mode == "processed_logprobs"
    named = [("a.weight", torch.zeros(2, 3)), ("b.bias", torch.ones(4, dtype=torch.bfloat16))]
    source = _received_weights_source(named)
    assert source.implements_iter_full() and source.owned_names(0) == ["a.weight", "b.bias"]
    assert [m.shape for m in source.metadata] == [(2, 3), (4,)]
    assert [n for n, _ in source.iter_full()] == [n for n, _ in source.iter_full()] == ["a.weight", "b.bias"]  # re-iterable
    assert IPCTrainerInitInfo(rank=0).is_sender
    assert versions_from_spans(6, [WeightVersionSpan("3", 0, 4), WeightVersionSpan("4", 4, 6)], 3) == [3, 3, 3, 3, 4, 4]
