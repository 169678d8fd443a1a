"""Where a CPU generation spends its time, by kind of operator (``afctl bench rollout
--profile``): one run under ``torch.profiler``, each operator's own time summed into
matmuls, attention, the KV cache's gathers and writes, sampling, and the rest."""

from __future__ import annotations

from collections.abc import Callable

KINDS: dict[str, tuple[str, ...]] = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_softmax"),
    "kv_cache": ("aten::index", "aten::index_select", "aten::_index_put_impl_", "aten::index_copy_", "aten::cat"),
    "sampling": (
        "aten::multinomial",
        "aten::exponential_",
        "aten::cumsum",
        "aten::searchsorted",
        "aten::_log_softmax",
        "aten::exp",
        "aten::uniform_",
        "aten::argmax",
        "aten::topk",
        "aten::sort",
    ),
}
"""Operator names (self time) counted under each kind; any other operator is ``other``."""


def op_breakdown(run: Callable[[], object]) -> dict[str, float]:
    """Seconds of operator self time by kind for one call of ``run``, and ``wall_s``:
    its wall time under the profiler (a few percent above an unprofiled run)."""
    import time

    from torch.profiler import ProfilerActivity, profile

    kind_of = {op: kind for kind, ops in KINDS.items() for op in ops}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
    seconds = dict.fromkeys([*KINDS, "other"], 0.0)
    for event in prof.key_averages():
        seconds[kind_of.get(event.key, "other")] += event.self_cpu_time_total / 1e6
    seconds["python_and_idle"] = max(0.0, wall - sum(seconds.values()))
    return {k: round(v, 3) for k, v in seconds.items()} | {"wall_s": round(wall, 3)}
