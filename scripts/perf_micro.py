"""The framework changes of issue 13 one by one, old code against new, side by side
in one process, on the tiny model ``examples/local.toml`` builds (one thread).

    python scripts/perf_micro.py [--before-rev b50b5b7] [--json]

- token_batch: ``actors/_batching.token_batch`` of the old commit vs this one (128 rows);
- generate: the old commit's ``NativeRolloutEngine`` vs this one, 16 prompts x 8
  samples, 6 new tokens, the same seed (their completions are checked equal);
- attention mask: the training forward + backward with the mask vs without
  (right padding, as the engine now does);
- optimizer: AdamW's step, default vs fused.

Prints ms per call of each side and one JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def old_module(rev: str, path: str, name: str):
    """Module ``path`` of commit ``rev``, imported under ``name`` (the rest of the package is this tree's)."""
    text = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, stdout=subprocess.PIPE, check=True, text=True).stdout
    file = Path(tempfile.mkdtemp(prefix="af-micro-")) / f"{name}.py"
    file.write_text(text)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def per_call_ms(fn, n: int) -> float:
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before-rev", default="b50b5b7")
    parser.add_argument("--rounds", type=int, default=3, help="alternate old/new this many times; the best of each")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import numpy as np
    import torch

    torch.set_num_threads(1)
    from asyncflow.actors.runtime.batching import token_batch
    from asyncflow.actors.runtime.run_dir import encode_prompt
    from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
    from asyncflow.engines.hf import load_model, load_tokenizer
    from asyncflow.engines.native_rollout import NativeRolloutEngine
    from asyncflow.toy.tasks import make_task_model

    model_dir = make_task_model(Path(tempfile.mkdtemp(prefix="af-micro-model-")), task="add", warm_start_steps=100)
    tok = load_tokenizer(model_dir)
    rng = np.random.default_rng(0)
    prompts = [encode_prompt(tok, f"{a}+{b}=", True) for a, b in rng.integers(0, 10, (16, 2))]
    responses = [rng.integers(3, 20, rng.integers(1, 7)).astype(np.int64) for _ in range(128)]
    rows_p = [prompts[i // 8] for i in range(128)]
    logps = [rng.standard_normal(len(r)).astype(np.float32) for r in responses]
    old_batching = old_module(args.before_rev, "asyncflow/actors/runtime/batching.py", "old_batching")
    old_rollout = old_module(args.before_rev, "asyncflow/engines/native_rollout.py", "old_native_rollout")

    cfg = RolloutEngineConfig(max_batch_size=128)
    params = SamplingParams(n=8, max_new_tokens=6, temperature=1.0, stop_token_ids=(tok.eos_token_id,), seed=7)
    engines = {"old": old_rollout.NativeRolloutEngine(cfg, model_dir), "new": NativeRolloutEngine(cfg, model_dir)}
    lists = [p.tolist() for p in prompts]
    outs = {k: [(c.response_ids, c.logprobs) for c in e.generate(lists, params)] for k, e in engines.items()}
    if outs["old"] != outs["new"]:
        raise SystemExit("the old and new engines generated different completions for one seed")

    lm = load_model(model_dir)
    lm.train()
    tb, _ = token_batch(rows_p, responses, {"rollout_logp": logps})

    def fwd_bwd(mask):
        logits = lm(input_ids=tb.input_ids, attention_mask=mask, use_cache=False).logits
        logits.float().logsumexp(-1).mean().backward()

    fwd_bwd(tb.attention_mask)
    optims = {
        "default": torch.optim.AdamW(lm.parameters(), lr=1e-9),
        "fused": torch.optim.AdamW(lm.parameters(), lr=1e-9, fused=True),
    }
    cases = {
        "token_batch": {
            "old": lambda: old_batching.token_batch(rows_p, responses, {"rollout_logp": logps}),
            "new": lambda: token_batch(rows_p, responses, {"rollout_logp": logps}),
            "n": 50,
        },
        "generate": {
            "old": lambda: engines["old"].generate(lists, params),
            "new": lambda: engines["new"].generate(lists, params),
            "n": 20,
        },
        "forward_backward_mask": {"old": lambda: fwd_bwd(tb.attention_mask), "new": lambda: fwd_bwd(None), "n": 20},
        "adamw_step": {"old": optims["default"].step, "new": optims["fused"].step, "n": 50},
    }
    result: dict = {}
    for name, case in cases.items():
        best = {"old": float("inf"), "new": float("inf")}
        for _ in range(args.rounds):
            for side in ("old", "new"):
                best[side] = min(best[side], per_call_ms(case[side], case["n"]))
        result[name] = {
            "old_ms": round(best["old"], 3),
            "new_ms": round(best["new"], 3),
            "ratio": round(best["old"] / best["new"], 2),
        }
        print(f"{name:<24} old {best['old']:8.3f} ms   new {best['new']:8.3f} ms   {best['old'] / best['new']:.2f}x")
    if args.json:
        print(json.dumps({"micro": result, "before_rev": args.before_rev}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
