import json

import pytest
from click.testing import CliRunner

from asyncflow.bench.decode import decode


@pytest.mark.slow  # a graph compiles: 90 s on the loaded 2-core machine
@pytest.mark.timeout(300)
def test_bench_decode_times_eager_and_compiled_steps_on_the_same_inputs_and_they_agree():
    result = CliRunner().invoke(decode, ["--rows", "3", "--steps", "2", "--hidden-size", "64", "--num-layers", "2", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    (row,) = figures["rows"]
    assert (row["rows"], row["graph_rows"], row["graph_keys"]) == (3, 3, 128)  # max_batch_size 3: one bucket of 3
    assert row["eager_ms"] > 0 and row["compiled_ms"] > 0
    assert row["same_greedy"] and row["max_logp_gap"] <= 1e-5
    assert figures["recompiles"] == 0
