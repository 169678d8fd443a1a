"""The discrete-event simulation, its Chrome trace and its PNG timeline."""

import json

import numpy as np

from asyncflow.planner.calibration import Efficiency
from asyncflow.planner.cost import Workload
from asyncflow.planner.hardware import get_hardware
from asyncflow.planner.io import simulate_plan
from asyncflow.planner.models import PRESETS, ModelShape
from asyncflow.planner.search import search
from asyncflow.planner.simulate import response_lengths, simulate

TINY = ModelShape(
    name="tiny",
    num_layers=2,
    hidden_size=64,
    intermediate_size=192,
    num_attention_heads=4,
    num_kv_heads=2,
    vocab_size=100,
    tie_word_embeddings=True,
)
WL = Workload(prompts_per_step=32, samples_per_prompt=8, response_len_tokens=1024, max_response_len_tokens=8192)


def _plan(model="7b", hw="h100", n=16, wl=WL):
    return search(PRESETS[model], get_hardware(hw), wl, n).plans[0]


def test_response_lengths_are_long_tailed_around_the_mean_and_capped():
    lengths = response_lengths(WL, num_steps=20, seed=1)
    assert lengths.shape == (20, 256)
    assert lengths.max() <= 8192 and lengths.min() >= 1
    assert abs(lengths.mean() - 1024) / 1024 < 0.1
    assert np.percentile(lengths, 99) > 3 * np.median(lengths)


def test_the_async_step_is_no_slower_than_the_sync_step():
    for model, hw, n in ((PRESETS["7b"], "h100", 16), (PRESETS["32b"], "910b", 64), (TINY, "cpu", 2)):
        wl = (
            WL
            if hw != "cpu"
            else Workload(
                prompts_per_step=4,
                samples_per_prompt=4,
                prompt_len_tokens=64,
                response_len_tokens=64,
                max_response_len_tokens=256,
            )
        )
        plan = search(model, get_hardware(hw), wl, n).plans[0]
        sync, streaming = simulate(model, get_hardware(hw), Efficiency(), wl, plan, num_steps=5)
        assert streaming.step_s <= sync.step_s, (model, hw)
        assert 0 < streaming.rollout_busy_fraction <= 1 and 0 < sync.rollout_busy_fraction <= 1
        assert streaming.rollout_busy_fraction >= sync.rollout_busy_fraction


def test_the_trace_is_valid_chrome_trace_json_and_the_png_is_a_png(tmp_path):
    result = simulate_plan(PRESETS["7b"], get_hardware("h100"), Efficiency(), WL, _plan(), num_steps=4, out_dir=tmp_path)
    trace = json.loads((tmp_path / "trace.json").read_text())
    events = trace["traceEvents"]
    assert events and {e["ph"] for e in events} == {"M", "X", "C"}
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {"sync", "async"}
    for e in events:
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0 and isinstance(e["name"], str)
    # Complete events on one thread never overlap (viewers would draw them wrongly).
    by_thread = {}
    for e in (e for e in events if e["ph"] == "X"):
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort()
        assert all(a_end <= b_start + 1e-3 for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    png = (tmp_path / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    assert result.async_step_s <= result.sync_step_s
