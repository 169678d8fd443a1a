"""The framework's own costs: their fits from synthetic profile points, and the cost
model and `afctl plan --config` including them (asyncflow/planner/framework.py)."""

from __future__ import annotations

import pytest

from asyncflow.planner import framework
from asyncflow.planner.calibration import Efficiency, Point, Profile, fit_corun, fit_terms
from asyncflow.planner.hardware import get_hardware
from asyncflow.planner.models import ModelShape

TINY = ModelShape(
    name="tiny",
    num_layers=2,
    hidden_size=64,
    intermediate_size=192,
    num_attention_heads=4,
    num_kv_heads=2,
    vocab_size=64,
    tie_word_embeddings=True,
)


@pytest.mark.timeout(10)
def test_fit_terms_recovers_a_fixed_cost_and_a_cost_per_row():
    rows = [32.0, 128.0, 512.0]
    times = [0.0004 + 4e-5 * r for r in rows]
    fixed, per_row = fit_terms([[1.0] * 3, rows], times)
    assert fixed == pytest.approx(0.0004, rel=1e-6) and per_row == pytest.approx(4e-5, rel=1e-6)


@pytest.mark.timeout(10)
def test_fit_terms_keeps_coefficients_non_negative():
    # times that fall with size: no negative per-row cost, the fixed part takes it
    fixed, per_row = fit_terms([[1.0] * 3, [8.0, 64.0, 256.0]], [0.0010, 0.0009, 0.0008])
    assert per_row == 0.0 and fixed == pytest.approx(0.0009, rel=0.1)


@pytest.mark.timeout(10)
def test_fit_corun_is_the_ratio_of_two_at_once_to_alone_and_never_below_one():
    points = [
        Point(kind="corun", size="alone", work=1.0, time_s=0.040),
        Point(kind="corun", size="two", work=2.0, time_s=0.050),
        Point(kind="corun", size="two", work=2.0, time_s=0.054),
    ]
    assert fit_corun(points) == pytest.approx(1.3)
    assert fit_corun([points[0], Point(kind="corun", size="two", work=2.0, time_s=0.030)]) == 1.0
    with pytest.raises(ValueError, match="alone"):
        fit_corun(points[1:])


@pytest.mark.timeout(20)
def test_profile_fit_sets_the_framework_terms_from_their_points():
    from asyncflow.planner.calibration import fit_errors, fit_profile

    hw = get_hardware("cpu")
    peak = hw.peak_bf16_flops
    points = [Point(kind="trainer", size="r", work=r, time_s=0.0003 + 5e-5 * r) for r in (32.0, 128.0, 512.0)]
    points += [Point(kind="snapshot", size="p", work=p, time_s=0.001 + 6e-10 * p) for p in (1e5, 8e5, 3.2e6, 1.07e7)]
    points += [Point(kind="queue", size="q", work=r, time_s=0.0007 + 4e-6 * r) for r in (8.0, 64.0, 256.0)]
    points += [Point(kind="corun", size="alone", work=1.0, time_s=0.03), Point(kind="corun", size="two", work=2.0, time_s=0.039)]
    # prefill = a call of one token: per call 2 ms + 0.1 ms per sequence + 1 ms per layer + FLOPs at 0.5 of peak
    prefill = [(2, 4, 1e8), (2, 16, 4e8), (2, 64, 5e7), (4, 4, 8e8), (4, 16, 3.2e9), (4, 64, 4e8), (6, 16, 2e10)]
    points += [
        Point(kind="prefill", size="p", work=w, num_layers=n, batch=b, time_s=0.002 + 1e-4 * b + 1e-3 * n + w / (0.5 * peak))
        for n, b, w in prefill
    ]
    # train: 10 ms per micro-batch + 5 us per token per layer + FLOPs at 0.6 of peak
    train = [(256, 2, 1e8), (1024, 2, 4e8), (256, 4, 8e8), (1024, 4, 3.2e9), (256, 6, 6e9), (1024, 6, 2.4e10)]
    points += [
        Point(kind="train", size="t", work=w, num_layers=n, tokens=t, time_s=0.01 + 5e-6 * t * n + w / (0.6 * peak))
        for t, n, w in train
    ]
    eff = fit_profile(points, hw)
    assert eff.trainer_overhead_s == pytest.approx(0.0003, rel=1e-3) and eff.trainer_overhead_s_per_row == pytest.approx(
        5e-5, rel=1e-3
    )
    assert eff.snapshot_overhead_s == pytest.approx(0.001, rel=1e-3) and eff.snapshot_s_per_param == pytest.approx(
        6e-10, rel=1e-3
    )
    assert eff.queue_ask_s == pytest.approx(0.0007, rel=1e-3) and eff.queue_ask_s_per_row == pytest.approx(4e-6, rel=1e-3)
    assert eff.corun_slowdown == pytest.approx(1.3)
    assert eff.generate_overhead_s == pytest.approx(0.002, rel=0.05)
    assert eff.generate_overhead_s_per_seq == pytest.approx(1e-4, rel=0.05)
    assert eff.prefill_overhead_s_per_layer == pytest.approx(1e-3, rel=0.05) and eff.prefill_flops == pytest.approx(0.5, rel=0.02)
    assert eff.train_overhead_s == pytest.approx(0.01, rel=0.05) and eff.train_flops == pytest.approx(0.6, rel=0.02)
    assert eff.train_overhead_s_per_token_layer == pytest.approx(5e-6, rel=0.05)
    errors = fit_errors(points, eff, hw)
    assert max(errors.values()) < 0.02


@pytest.mark.timeout(10)
def test_a_generate_call_decodes_until_its_longest_sample_over_the_sequences_still_running():
    hw = get_hardware("cpu")
    eff = Efficiency(
        decode_overhead_s=1e-3,
        decode_overhead_s_per_seq=1e-5,
        generate_overhead_s=2e-3,
        generate_overhead_s_per_seq=1e-4,
        decode_bandwidth=1.0,
        prefill_flops=1.0,
    )
    call = framework.generate_call(TINY, hw, eff, batch=64, prompt_tokens=6, mean_response=2.5, longest_response=4)
    assert call.iterations == 3  # prefill samples the first token
    assert call.overhead_s == pytest.approx(2e-3 + 64 * 1e-4)
    # per-sequence decode work: every sample's (length - 1) iterations, not batch x iterations
    bare = framework.generate_call(TINY, hw, Efficiency(decode_bandwidth=1.0, prefill_flops=1.0), 64, 6, 2.5, 4)
    assert call.decode_s - bare.decode_s > 3 * 1e-3 + 64 * 1.5 * 1e-5 - 1e-12
    assert call.decode_s - bare.decode_s < 3 * 1e-3 + 64 * 1.5 * 1e-5 + 1e-4  # + the (tiny) KV reads of live sequences
    capped = framework.generate_call(TINY, hw, eff, batch=64, prompt_tokens=6, mean_response=6, longest_response=6)
    assert capped.iterations == 5 and capped.decode_s > call.decode_s
    one = framework.generate_call(TINY, hw, eff, batch=64, prompt_tokens=6, mean_response=1, longest_response=1)
    assert one.iterations == 0 and one.decode_s == 0.0


@pytest.mark.timeout(10)
def test_queue_asks_and_the_corun_stretch():
    eff = Efficiency(queue_ask_s=1e-3, queue_ask_s_per_row=1e-5, corun_slowdown=1.4)
    assert framework.queue_s(eff, 4, 64) == pytest.approx(4 * (1e-3 + 64e-5))
    assert framework.corun_stretch(eff, 0.0) == 1.0 and framework.corun_stretch(eff, 1.0) == pytest.approx(1.4)
    assert framework.corun_stretch(eff, 0.5) == pytest.approx(1.2) and framework.corun_stretch(eff, 3.0) == pytest.approx(1.4)


@pytest.mark.timeout(10)
def test_the_cost_model_charges_the_calibrated_overheads():
    from asyncflow.planner.cost import Workload, forward_cost, rollout_cost, train_cost

    hw = get_hardware("cpu")
    wl = Workload(
        prompt_len_tokens=6,
        response_len_tokens=4,
        max_response_len_tokens=6,
        prompts_per_step=16,
        samples_per_prompt=8,
        use_reference=False,
    )
    base = Efficiency()
    more = Efficiency(
        generate_overhead_s=0.002,
        generate_overhead_s_per_seq=1e-4,
        train_overhead_s_per_token_layer=5e-6,
        forward_overhead_s_per_token_layer=2e-6,
    )
    r0, r1 = rollout_cost(TINY, hw, base, wl, 1, 1), rollout_cost(TINY, hw, more, wl, 1, 1)
    calls = -(-wl.num_samples // r0.batch_per_instance)
    assert r1.time_s - r0.time_s == pytest.approx(calls * 0.002 + wl.num_samples * 1e-4)
    tokens = wl.num_samples * wl.mean_seq_tokens
    t0, t1 = train_cost(TINY, hw, base, wl, 1, 1, 1), train_cost(TINY, hw, more, wl, 1, 1, 1)
    assert t1.time_s - t0.time_s == pytest.approx(tokens * TINY.num_layers * 5e-6)
    f0, f1 = forward_cost(TINY, hw, base, wl, 1, 1), forward_cost(TINY, hw, more, wl, 1, 1)
    assert f1.time_s - f0.time_s == pytest.approx(tokens * TINY.num_layers * 2e-6)


LOCAL_LIKE = """
    [algorithm]
    group_size = 8
    [rollout]
    prompts_per_call = 8
    [rollout.sampling]
    max_new_tokens = 6
    [train]
    prompts_per_step = 16
"""


@pytest.mark.timeout(120)
def test_plan_config_adds_the_framework_terms_to_the_stages():
    from asyncflow.config.load import load_config_text
    from asyncflow.planner.predict import ConfigInputs, predict

    cfg = load_config_text(LOCAL_LIKE)
    base_eff = Efficiency()
    # what the CLI measures from the config's model and data (tests/planner/test_workflow_model.py), fixed here
    inputs = ConfigInputs(model=TINY, prompt_tokens=6.0, reward_score_s={"sync": 2e-3, "async": 5e-4})

    def run(eff: Efficiency, **kw) -> dict:
        return predict(cfg, Profile(hardware="cpu", efficiency=eff), inputs, num_steps=10, cores=2, poll_s=0.05, **kw)

    base = run(base_eff)
    asks = run(Efficiency(queue_ask_s=1e-3))
    for mode in ("sync",):  # (in async the queue's CPU also stretches the overlapping stages: below)
        b, a = base["modes"][mode]["stages"], asks["modes"][mode]["stages"]
        assert a["call_s"] - b["call_s"] == pytest.approx(framework.ROLLOUT_CALL_ASKS * 1e-3)
        assert a["train_s"] - b["train_s"] == pytest.approx(framework.TRAINER_STEP_ASKS * 1e-3)
        assert a["publish_s"] - b["publish_s"] == pytest.approx(framework.PUBLISH_ASKS * 1e-3)
        assert a["poll_s"] - b["poll_s"] == pytest.approx(framework.POLL_ASKS * 1e-3)
        assert a["swap_s"] - b["swap_s"] == pytest.approx(0.0)  # sync: no swap grant (framework.swap_asks)
        # the reward phase: its asks, beside the config's reward function timed in each prediction
        reward = lambda out, s: s["reward_s"] - out["framework"]["reward_score_s"][mode]  # noqa: E731
        b_ = base["modes"][mode]["stages"]
        assert reward(asks, a) - reward(base, b_) == pytest.approx(framework.REWARD_UNIT_ASKS * 1e-3)
    a, b = asks["modes"]["async"]["stages"], base["modes"]["async"]["stages"]
    assert a["call_s"] - b["call_s"] > framework.ROLLOUT_CALL_ASKS * 1e-3
    assert asks["modes"]["async"]["contention"]["train"] > base["modes"]["async"]["contention"]["train"]
    handoff = run(Efficiency(queue_handoff_s=0.004))
    assert (
        handoff["modes"]["sync"]["stages"]["reward_s"]
        - handoff["framework"]["reward_score_s"]["sync"]
        - base["modes"]["sync"]["stages"]["reward_s"]
        + base["framework"]["reward_score_s"]["sync"]
    ) == pytest.approx(0.008)
    assert base["framework"]["reward_score_s"] == inputs.reward_score_s
    own = run(
        Efficiency(
            trainer_overhead_s=0.002, trainer_overhead_s_per_row=1e-5, snapshot_overhead_s=0.001, snapshot_s_per_param=1e-9
        )
    )
    sb, so = base["modes"]["sync"]["stages"], own["modes"]["sync"]["stages"]
    assert so["train_s"] - sb["train_s"] == pytest.approx(0.002 + 128 * 1e-5)
    assert so["publish_s"] - sb["publish_s"] == pytest.approx(0.001 + base["num_params"] * 1e-9)
    # the call: longest - 1 decode iterations; without lengths, the cap
    assert base["call"]["iterations"] == 5
    short = run(base_eff, response_len=2.5, longest_response_len=4)
    assert short["call"]["iterations"] == 3 and short["call"]["time_s"] < base["call"]["time_s"]
    assert short["engine_train_s"] < base["engine_train_s"]  # the padded batch is shorter
    # sharing the machine slows the overlapping async stages, never the sync phases
    base_async = base["modes"]["async"]["contention"]
    shared = run(Efficiency(corun_slowdown=1.5))
    for stage in ("call_s", "train_s", "publish_s"):
        assert shared["modes"]["sync"]["stages"][stage] == pytest.approx(base["modes"]["sync"]["stages"][stage])
    assert shared["modes"]["async"]["stages"]["call_s"] > base["modes"]["async"]["stages"]["call_s"]
    assert base_async["train"] < shared["modes"]["async"]["contention"]["train"] <= 1.5 * base_async["train"]


@pytest.mark.timeout(10)
def test_a_gated_replica_that_wakes_on_the_announcement_does_not_wait_for_its_poll_to_end():
    from asyncflow.planner.workflow import StageTimes, simulate

    # 2 calls of 25 ms, then training 30 ms: with a 50 ms poll the period is 100 ms (two
    # polls after the last call); woken by the announcement, it is the 80 ms chain itself
    polled = simulate(StageTimes(call_s=0.025, calls_per_step=2, train_s=0.03, poll_s=0.05), 1, 0, 20)
    woken = simulate(StageTimes(call_s=0.025, calls_per_step=2, train_s=0.03, poll_s=0.05, wake_on_announce=True), 1, 0, 20)
    assert polled.step_s == pytest.approx((19 * 0.1 + 0.03) / 20)
    assert woken.step_s == pytest.approx((19 * 0.08 + 0.03) / 20) and woken.num_polls == 0


@pytest.mark.timeout(10)
def test_shared_core_stretch_is_the_expected_time_slice_of_the_runnable_processes():
    assert framework.shared_core_stretch([], 2) == 1.0
    assert framework.shared_core_stretch([1.0], 2) == 1.0  # two processes, two cores
    assert framework.shared_core_stretch([1.0, 1.0], 2) == pytest.approx(1.5)  # three on two cores
    # one other always, a third half the time: half the time 3 share 2 cores
    assert framework.shared_core_stretch([1.0, 0.5], 2) == pytest.approx(0.5 * 1.0 + 0.5 * 1.5)
    assert framework.shared_core_stretch([0.5, 0.5], 1) == pytest.approx(0.25 * 1 + 0.5 * 2 + 0.25 * 3)
    eff = Efficiency(queue_ask_s=1e-3)
    aux = framework.aux_cpu_s(eff, calls_per_step=2, reward_score_s=0.002)
    assert aux["reward"] == pytest.approx(2 * (0.002 + framework.REWARD_UNIT_ASKS * 1e-3))
    assert aux["queue"] == pytest.approx(
        (2 * (framework.ROLLOUT_CALL_ASKS + framework.REWARD_UNIT_ASKS) + framework.TRAINER_STEP_ASKS) * 1e-3
    )
