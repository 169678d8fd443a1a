"""`afctl plan --model llama3-8b`: no line is left hanging, and the rollout's tensor-parallel
degree is the smallest that fits in memory unless the output says why a larger one wins."""

import pytest
from click.testing import CliRunner

from asyncflow.cli.main import main
from asyncflow.planner import HARDWARE, PRESETS, Efficiency, Workload, search
from asyncflow.planner.cost import rollout_cost
from asyncflow.planner.search import async_rollout_score


def _plan_output(*args: str) -> str:
    result = CliRunner().invoke(main, ["plan", *args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args",
    [("--model", "llama3-8b", "--gpus", "8"), ("--model", "llama3-8b", "--gpus", "64"), ("--model", "0.5b", "--gpus", "8")],
    ids=" ".join,
)
def test_no_line_of_the_plan_ends_with_a_colon_and_nothing_after_it(args):
    lines = _plan_output(*args).splitlines()
    dangling = [line for k, line in enumerate(lines) if line.rstrip().endswith(":") and not lines[k + 1 :]]
    headers_without_items = [
        line for k, line in enumerate(lines[:-1]) if line.rstrip().endswith(":") and not lines[k + 1].startswith("  ")
    ]
    assert not dangling and not headers_without_items, "\n".join(lines)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_gpus", [8, 16, 32, 64])
def test_the_llama3_8b_rollout_takes_the_smallest_tp_that_fits_or_the_plan_says_why_not(num_gpus):
    model, hw, eff, wl = PRESETS["llama3-8b"], HARDWARE["h100"], Efficiency(), Workload()  # --gpus: h100
    best = search(model, hw, wl, num_gpus, eff).plans[0]
    devices = best.rollout_devices
    costs = {tp: rollout_cost(model, hw, eff, wl, devices, tp) for tp in (1, 2, 4, 8) if devices % tp == 0}
    fitting = {tp: c for tp, c in costs.items() if c.feasible}
    smallest = min(fitting)
    assert smallest == 1, "an 8B model's rollout fits one 80 GB device"
    # the choice is the planner's own best score among the degrees that fit
    scores = {tp: async_rollout_score(model, hw, wl, c) for tp, c in fitting.items()}
    assert scores[best.rollout_tp] == min(scores.values())
    out = _plan_output("--model", "llama3-8b", "--gpus", str(num_gpus))
    said = [line for line in out.splitlines() if line.startswith(f"rollout at tp{best.rollout_tp} although tp{smallest}")]
    if best.rollout_tp == smallest:
        assert not said, out
    else:  # a larger degree wins on the planner's numbers: the output says why, with both numbers
        assert len(said) == 1, out
        assert f"{scores[smallest]:.1f} s" in said[0] and f"{scores[best.rollout_tp]:.1f} s" in said[0], out
