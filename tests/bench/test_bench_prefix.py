"""``afctl bench prefix`` on the tiny model: the conversations run the same tokens with the
prefix cache on and off, and with it on the later turns run only what the earlier did not."""

import json

import pytest
from click.testing import CliRunner

from asyncflow.cli.main import main as cli


@pytest.mark.timeout(120)
def test_bench_prefix_runs_fewer_prompt_tokens_with_the_cache_for_the_same_conversations():
    got = CliRunner().invoke(cli, ["bench", "prefix", "--conversations", "4", "--turns", "3", "--repeats", "1", "--json"])
    assert got.exit_code == 0, got.output
    x = json.loads(got.output.strip().splitlines()[-1])
    assert x["same_tokens"] is True
    assert x["cached_tokens"] > 0 and x["prefill_tokens_cache"] < x["prefill_tokens_no_cache"]
    assert "prompt tokens run" in got.output and "served from the cache" in got.output
