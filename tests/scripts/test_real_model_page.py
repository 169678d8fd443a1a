"""docs/real-model.md's paired comparisons (scripts/real_model_page.py): the verdict line of
issue 26's accuracy target and the float32 set's comparison with the bfloat16 set are
computed from the records, seed by seed, and say "met" only when the mean is at least 0."""

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import real_model_page as page  # noqa: E402


def record(trl: float, async_: float) -> dict:
    return {
        "result": {
            "systems": {
                "trl": {"heldout_accuracy": trl, "samples_per_s": 1.5},
                "async": {"heldout_accuracy": async_, "samples_per_s": 3.0},
            }
        }
    }


FP32 = {0: (0.60, 0.50), 1: (0.55, 0.60), 2: (0.62, 0.61), 3: (0.58, 0.56)}
BF16 = {0: (0.59, 0.49), 1: (0.55, 0.65), 2: (0.61, 0.63), 3: (0.61, 0.60)}


def records() -> dict[str, dict]:
    out = {f"real_paired_fp32_seed{s}": record(*v) for s, v in FP32.items()}
    out.update({f"real_paired_stream_seed{s}": record(*v) for s, v in BF16.items()})
    return out


def test_fp32_set_verdict_and_the_seed_by_seed_comparison_with_the_bf16_set():
    text = "\n".join(page._paired_over_seeds(records(), page.PAIRED_FP32_SEEDS))
    now = [a - t for t, a in FP32.values()]
    then = [a - t for t, a in BF16.values()]
    change = [x - y for x, y in zip(now, then)]
    se = statistics.stdev(now) / len(now) ** 0.5
    assert f"not met on the mean ({statistics.mean(now):+.3f} over 4 seeds" in text
    assert f"s.e. {se:.3f}" in text
    assert f"async minus TRL {statistics.mean(now):+.3f} here, {statistics.mean(then):+.3f} there" in text
    assert f"float32 minus bfloat16, {statistics.mean(change):+.3f}" in text
    assert f"{statistics.correlation(now, then):+.2f}" in text
    assert "Samples/s, async over TRL on both cores, median over the seeds: 2.00x" in text
    # the earlier column is the bfloat16 set's async, seed by seed
    assert "| 0 | 0.600 | 0.500 | -0.100 | 0.490 |" in text


def test_met_only_when_async_is_at_least_trl_on_the_mean():
    recs = {f"real_paired_fp32_seed{s}": record(t, t + 0.01 * (s - 1)) for s, (t, _) in FP32.items()}
    text = "\n".join(page._paired_over_seeds(recs, page.PAIRED_FP32_SEEDS))
    assert "target, async's held-out accuracy at least TRL's, paired by data: met on the mean (+0.005" in text
    assert "Against the bfloat16 set" not in text  # no bfloat16 records: nothing to compare with


def test_a_two_digit_seed_is_rendered_under_its_own_number():
    recs = {f"real_paired_stream_seed{s}": record(0.5, 0.5 + 0.01 * s) for s in (0, 1, 12)}
    for name in recs:
        recs[name].update(command=f"bench peer {name}", when="2026-12-07 02:00", seconds=600, load_avg_1m=1.0)
    table = "\n".join(page._paired_over_seeds(recs, page.PAIRED_STREAM_SEEDS))
    assert "| 12 | 0.500 | 0.620 | +0.120 |" in table
    assert "over 3 seeds" in table
    assert "Apart" not in table  # one seed past 9 has no spread of its own
    recs |= {"real_paired_stream_seed13": {**recs["real_paired_stream_seed12"], "result": record(0.6, 0.5)["result"]}}
    table = "\n".join(page._paired_over_seeds(recs, page.PAIRED_STREAM_SEEDS))
    assert "Apart: seeds 0-9 +0.005 (s.e. 0.005), seeds 10-13 +0.010 (s.e. 0.110, 2 seeds" in table
    commands = {n: f"bench peer {n}" for n in page.REAL}
    text = page.render_real(recs, commands)
    assert "- seed 12: `bench peer real_paired_stream_seed12`" in text
    assert "- seed 2: `bench peer real_paired_stream_seed12`" not in text


def test_the_targets_table_says_met_only_where_every_run_meets_its_target():
    def run(final: float, minutes: float, met: bool) -> dict:
        return {"val_start_accuracy": 0.078, "val_final_accuracy": final, "wall_s": minutes * 60, "met_target": met}

    learning = {
        "seeds": [0, 1],
        "target": {"factor": 3.0, "floor": 0.3, "minutes": 30.0},
        "async": [run(0.5, 5.3, True), run(0.2, 5.6, False)],
        "sync": [run(0.49, 6.1, True), run(0.56, 6.1, True)],
    }
    three = {"systems": {n: {"samples_per_s": v, "threads": 2} for n, v in (("trl", 1.0), ("sync", 1.2), ("async", 1.4))}}
    recs = {"real_model": {"result": {"real_model": learning}}, "real_peer": {"result": three}}
    recs |= {f"real_paired_stream_seed{s}": record(*v) for s, v in BF16.items()}  # async - TRL +0.0025
    recs |= {f"real_paired_fp32_seed{s}": record(*v) for s, v in FP32.items()}  # -0.02
    recs["real_rollout"] = {"result": {"tokens_per_s": 177.4, "baseline_tokens_per_s": 81.1, "ratio": 2.188}}
    rows = {line.split(" | ")[0]: line for line in page._targets(recs) if line.startswith("| ")}
    assert rows["| 3: the example learns (real_model)"].endswith("| not met: 3 of 4 runs |")
    assert "async seed 1 0.078 -> 0.200 in 5.6 min" in rows["| 3: the example learns (real_model)"]
    assert rows["| 4: async's samples/s against TRL's, one invocation each"].endswith(
        "| 1.40x (real_peer, TRL on 2 threads) | not met: 0 of 1 invocations |"
    )
    assert rows["| 4: sync's samples/s against TRL's, one invocation each"].endswith("| met: 1 of 1 invocations |")
    stream = rows["| 4: held-out accuracy, paired by data: streamed on-policy (real_paired_stream_seedN)"]
    assert "+0.003 (s.e. 0.041, 4 seeds" in stream and stream.endswith("| met |")
    assert rows[
        "| 4: held-out accuracy, paired by data: streamed on-policy, both trainers in float32 (real_paired_fp32_seedN)"
    ].endswith("| not met |")
    assert rows["| 5: the native rollout engine against HF generate (real_rollout)"].endswith("2.19x | met |")
    assert page._targets({}) == []  # nothing measured: no table
