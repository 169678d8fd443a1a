import msgspec
import pytest
import torch

from asyncflow.engines.base import chunk_by_bytes
from asyncflow.engines.batching import make_token_batch
from asyncflow.engines.config import RolloutEngineConfig, TrainEngineConfig
from asyncflow.engines.device import BACKENDS, dist_backend, torch_device
from asyncflow.engines.factory import build_rollout_engine, build_train_engine


def test_token_batch_aligns_rollout_logprobs_and_advantages_with_response_tokens():
    tb = make_token_batch(
        [[1, 2], [3]],
        [[4, 5, 6], [7]],
        pad_token_id=0,
        rollout_logprobs=[[-0.1, -0.2, -0.3], [-0.4]],
        advantages_B=torch.tensor([1.5, -2.0]),
    )
    assert tb.input_ids.tolist() == [[1, 2, 4, 5, 6], [3, 7, 0, 0, 0]]
    assert tb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert tb.response_mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]]
    assert torch.allclose(tb.rollout_logp, torch.tensor([[0, 0, -0.1, -0.2, -0.3], [0, -0.4, 0, 0, 0]]))
    assert tb.advantages.tolist() == [[0, 0, 1.5, 1.5, 1.5], [0, -2.0, 0, 0, 0]]


def test_micro_batches_are_trimmed_to_their_longest_sequence():
    tb = make_token_batch([[1, 2], [3]], [[4, 5, 6], [7]], pad_token_id=0)
    first, second = tb.split(1)
    assert first.input_ids.shape == (1, 5) and second.input_ids.shape == (1, 2)


def test_weights_are_chunked_by_bytes_without_splitting_a_tensor():
    pairs = [("a", torch.zeros(10)), ("b", torch.zeros(10)), ("c", torch.zeros(30))]
    chunks = list(chunk_by_bytes(pairs, chunk_bytes=80))
    assert [[n for n, _ in c] for c in chunks] == [["a", "b"], ["c"]]


def test_configs_reject_unknown_fields_with_the_field_name():
    with pytest.raises(msgspec.ValidationError, match="kv_cache_byte"):
        msgspec.json.decode(b'{"type": "native", "kv_cache_byte": 1}', type=RolloutEngineConfig)
    cfg = msgspec.json.decode(b'{"lr": 0.001, "fsdp": true}', type=TrainEngineConfig)
    assert cfg.lr == 0.001 and cfg.fsdp and cfg.type == "torch"


def test_factory_refuses_unknown_engine_types_and_fsdp_without_a_process_group(qwen2_dir):
    with pytest.raises(ValueError, match="use 'auto', 'native', 'hf'"):
        build_rollout_engine(msgspec.structs.replace(RolloutEngineConfig(), type="tgi"), qwen2_dir)
    with pytest.raises(RuntimeError, match="init_process_group"):
        build_train_engine(TrainEngineConfig(fsdp=True), qwen2_dir)


def test_each_device_kind_has_its_distributed_backend():
    assert BACKENDS == {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
    assert dist_backend("cpu") == "gloo"
    assert torch_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match="use 'cpu', 'cuda' or 'npu'"):
        torch_device("tpu")


def test_npu_without_torch_npu_says_what_to_install():
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed here")
    with pytest.raises(RuntimeError, match="torch_npu"):
        torch_device("npu")
