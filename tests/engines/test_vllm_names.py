"""What asyncflow tells vLLM by name, checked without vLLM or a GPU."""

import pytest

pytestmark = pytest.mark.timeout(60)


def test_the_worker_extension_resolves_the_way_vllm_resolves_it():
    """vLLM imports ``worker_extension_cls`` by ``qualname.rsplit(".", 1)``: module, then
    attribute (vllm.utils: resolve_obj_by_qualname). The name must lead to the class."""
    import importlib

    from asyncflow.engines.vllm_rollout import WORKER_EXTENSION
    from asyncflow.engines.vllm_worker import WeightSyncExtension

    module_name, obj_name = WORKER_EXTENSION.rsplit(".", 1)
    assert getattr(importlib.import_module(module_name), obj_name) is WeightSyncExtension
