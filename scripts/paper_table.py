"""docs/planner.md, 'The paper's settings': the planner's predicted speedup of the best
asynchronous plan over the verl-like colocated sync step, for Qwen2.5-7B and 32B on 32 to
1,024 Ascend 910B NPUs, at the assumed workload (prompts of 1,024 tokens, responses of
2,048 on average capped at 8,192, 256 prompts x 8 samples, KL to a reference, staleness
1, default efficiencies). Prints the markdown table and the summary line.

    python scripts/paper_table.py
"""

from __future__ import annotations

import statistics

import msgspec

from asyncflow.planner.cost import Workload
from asyncflow.planner.hardware import get_hardware
from asyncflow.planner.models import PRESETS
from asyncflow.planner.search import search, speedup


def mean_speedup(wl: Workload, grow_batch: bool = False) -> tuple[float, float]:
    """(mean, peak) predicted speedup over the table's 12 settings for another workload;
    ``grow_batch``: N/2 prompts per step on N NPUs."""
    hw, gains = get_hardware("910b"), []
    for model in ("7b", "32b"):
        for npus in (32, 64, 128, 256, 512, 1024):
            w = msgspec.structs.replace(wl, prompts_per_step=npus // 2) if grow_batch else wl
            gains.append(speedup(search(PRESETS[model], hw, w, npus)))
    return statistics.mean(gains), max(gains)


def main() -> None:
    hw, wl = get_hardware("910b"), Workload()
    print(
        "| model | NPUs | best async plan: rollout (tp) / train / ref | async s/step | colocated sync s/step "
        "| task-separated sync s/step | predicted speedup | bottleneck |"
    )
    print("|---|---|---|---|---|---|---|---|")
    gains: list[tuple[float, str, int]] = []
    for model in ("7b", "32b"):
        for npus in (32, 64, 128, 256, 512, 1024):
            result = search(PRESETS[model], hw, wl, npus)
            best = result.plans[0]
            gain = speedup(result)
            gains.append((gain, model, npus))
            ref = str(best.reference_devices) if best.reference_devices else "on train"
            colocated = f"{result.colocated.predicted_step_s:.1f}" if result.colocated else "-"
            separated = f"{result.sync.predicted_step_s:.1f}" if result.sync else "-"
            print(
                f"| {model} | {npus} | {best.rollout_devices} (tp{best.rollout_tp}) / {best.train_devices} / {ref} | "
                f"{best.predicted_step_s:.1f} | {colocated} | {separated} | {gain:.2f}x | {best.bottleneck} |"
            )
    top, low = max(gains), min(gains)
    print(
        f"\nPredicted: mean {statistics.mean(g for g, _, _ in gains):.2f}x, peak {top[0]:.2f}x ({top[1].upper()}, "
        f"{top[2]} NPUs), lowest {low[0]:.2f}x ({low[1].upper()}, {low[2]} NPUs)"
    )
    variants = {
        "the cap at 4,096 tokens": (msgspec.structs.replace(wl, max_response_len_tokens=4096), False),
        "the batch grown with the cluster (N/2 prompts)": (wl, True),
        "staleness 2": (msgspec.structs.replace(wl, staleness=2), False),
        "staleness 3": (msgspec.structs.replace(wl, staleness=3), False),
    }
    for name, (w, grow) in variants.items():
        mean, peak = mean_speedup(w, grow)
        print(f"With {name}: mean {mean:.2f}x, peak {peak:.2f}x")


if __name__ == "__main__":
    main()
