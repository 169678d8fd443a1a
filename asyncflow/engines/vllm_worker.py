"""A vLLM worker extension: methods vLLM mixes into each of its workers, reached from
the driver with ``collective_rpc(name, args=...)``. Used by the ``rpc`` weight path
(``[rollout.engine] weight_transfer``, the default for vllm_ascend, whose NPU workers
have no CUDA IPC or NCCL transfer engine); the CUDA paths use vLLM's own
weight-transfer engines instead (vllm_rollout.py).

Loaded by vLLM inside its worker processes (``worker_extension_cls=
"asyncflow.engines.vllm_worker.WeightSyncExtension"``); imports nothing from
asyncflow, so a worker needs only this file importable.

Invariant: weights are loaded through the model's own ``load_weights`` (vLLM's
loader maps Hugging Face names, fuses q/k/v and gate/up, and shards for tensor
parallelism), so the names the training engine exports work unchanged.
"""

from __future__ import annotations


class WeightSyncExtension:
    """Mixed into vLLM's worker class; ``self.model_runner`` is vLLM's."""

    def asyncflow_load_weights(self, named_tensors: list) -> int:
        """Load (name, tensor) pairs in place; returns how many were given."""
        runner = self.model_runner  # type: ignore[attr-defined]
        # the raw model: ``.model`` may be wrapped for CUDA graphs, which get_model() unwraps
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        device = next(model.parameters()).device
        model.load_weights(weights=((name, t.to(device, non_blocking=True)) for name, t in named_tensors))
        return len(named_tensors)
