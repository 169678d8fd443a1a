"""The planner's charge for a weight version's fan-out (planner/cost.py ``fanout_s``,
``[workflow] weight_fanout``): direct sends every copy from the trainer's side, the
relay tree sends degree copies and pipelines the rest."""

from __future__ import annotations

import pytest

from asyncflow.planner.calibration import Efficiency
from asyncflow.planner.cost import WEIGHT_CHUNK_BYTES, Workload, fanout_s, weight_transfer_s, workload_transfer_s
from asyncflow.planner.hardware import get_hardware
from asyncflow.planner.io import get_model

pytestmark = pytest.mark.timeout(10)


def test_direct_fanout_charges_one_copy_per_replica_and_the_tree_degree_copies_plus_a_chunk_hop_per_level():
    copy, chunk = 1.0, 0.01
    assert [fanout_s(copy, n) for n in (1, 2, 8, 128)] == [1.0, 2.0, 8.0, 128.0]
    assert fanout_s(copy, 1, "tree", 2, chunk) == 1.0  # one replica: the same single copy
    assert fanout_s(copy, 2, "tree", 2, chunk) == 2.0  # the root's children only
    assert fanout_s(copy, 128, "tree", 2, chunk) == pytest.approx(2.0 + 6 * 2 * chunk)  # depth 7
    assert fanout_s(copy, 128, "tree", 1, chunk) == pytest.approx(1.0 + 127 * chunk)  # a chain: flat in copies
    growth = [fanout_s(copy, n, "tree", 2, chunk) for n in (2, 8, 32, 128)]
    assert all(b - a == pytest.approx(2 * 2 * chunk) for a, b in zip(growth, growth[1:]))  # O(log n)


def test_the_planner_charges_the_workloads_fanout_to_its_rollout_instances():
    model, hw, eff = get_model("7b"), get_hardware("h100"), Efficiency()
    one = weight_transfer_s(model, hw, eff, rollout_tp=2)
    copy = one - hw.collective_latency_s
    direct = workload_transfer_s(model, hw, eff, Workload(), rollout_devices=64, rollout_tp=2)
    assert direct == pytest.approx(32 * copy + hw.collective_latency_s)  # 32 instances, each its copy from the trainer
    tree = workload_transfer_s(model, hw, eff, Workload(weight_fanout="tree"), rollout_devices=64, rollout_tp=2)
    chunk = WEIGHT_CHUNK_BYTES / (hw.inter_node_bandwidth_bytes_per_s * eff.link_bandwidth)
    assert tree == pytest.approx(2 * copy + (5 - 1) * 2 * chunk + hw.collective_latency_s)  # 32 replicas: depth 5
    assert weight_transfer_s(model, hw, eff, 2, colocated=True, replicas=32) == weight_transfer_s(
        model, hw, eff, 2, colocated=True
    )
    with pytest.raises(ValueError, match="weight fan-out 'ring'"):
        Workload(weight_fanout="ring").validate()
