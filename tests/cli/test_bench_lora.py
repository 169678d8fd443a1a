import json

import pytest
from click.testing import CliRunner

from asyncflow.bench.lora import lora


@pytest.mark.timeout(120)
def test_bench_lora_reports_at_least_ten_times_fewer_bytes_per_sync_with_adapters_on_attention():
    result = CliRunner().invoke(lora, ["--repeats", "1", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])["lora_sync"]
    full, adapters = figures["rows"]
    assert (full["mode"], adapters["mode"]) == ("full", "lora")
    assert figures["bytes_ratio"] == pytest.approx(full["bytes"] / adapters["bytes"], rel=1e-3)
    assert figures["bytes_ratio"] >= 10
