"""`afctl bench queue` runs end to end, as deployed (controller and shards in their own
processes), and reports the issue's keys."""

import json

from click.testing import CliRunner

from asyncflow.bench.queue import queue


def test_bench_queue_prints_the_figures_as_json_on_its_last_line():
    result = CliRunner().invoke(queue, ["-B", "4", "-L", "8", "-n", "3", "--warmup", "1", "--shards", "2", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["round_trip_ms"] > 0 and figures["samples_per_s"] > 0 and figures["shard_mem_ratio"] > 0
    assert figures["gbps"] >= 0  # rounds to 0.0 for rows this small
    assert figures["shards"] == 2 and figures["rounds"] == 3
