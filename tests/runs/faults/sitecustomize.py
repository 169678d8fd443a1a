"""Fault injection into the rollout engine of every process of a test run.

Python imports ``sitecustomize`` at start-up from the first directory on sys.path
that has one; the version-integrity tests put this directory on PYTHONPATH and name
a fault in ``AF_TEST_ROLLOUT_FAULT``. Without it, nothing is patched.

- ``partial_load``: load_weights skips one tensor (a replica that holds a mix of two
  versions while tagging rows with the new one);
- ``mid_unit_swap``: the weights change while a generate call runs (as a swap from
  another thread would do);
- ``mislabel``: completions are tagged one version newer than the weights held;
- ``slow_fetch``: every fetch of announced weights takes 0.3 s longer (a big model's
  transfer), so what a replica does while its weights travel shows in the trace.
"""

import dataclasses
import os

FAULT = os.environ.get("AF_TEST_ROLLOUT_FAULT", "")

if FAULT:
    import torch

    from asyncflow.engines.native_rollout import NativeRolloutEngine

    _load, _generate = NativeRolloutEngine.load_weights, NativeRolloutEngine.generate

    def load_weights(self, named_tensors, version):
        named = list(named_tensors)
        if FAULT == "partial_load":
            named = named[1:]
        _load(self, named, version)

    def generate(self, prompts, params):
        out = _generate(self, prompts, params)
        if FAULT == "mid_unit_swap":
            with torch.no_grad():
                next(iter(self.weights.params.values())).add_(1e-3)
        if FAULT == "mislabel" and self.version > 0:
            out = [dataclasses.replace(c, version=c.version + 1) for c in out]
        return out

    if FAULT == "slow_fetch":
        import time

        from asyncflow.actors.weights.nng import NngReceiver

        _fetch = NngReceiver.fetch

        def fetch(self, *args, **kwargs):
            time.sleep(0.3)
            return _fetch(self, *args, **kwargs)

        NngReceiver.fetch = fetch

    NativeRolloutEngine.load_weights = load_weights
    NativeRolloutEngine.generate = generate
