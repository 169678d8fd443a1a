"""examples/agent's SmolLM2 variant: its config (examples/agent/smollm2.toml) is a paced run on
gateway sessions, and its agent program (examples/agent/agent.py --task add2, the openai
client only) runs two-turn episodes through a real gateway whose rewarded sessions are what
the agent saw: here over the tests' tiny model, not SmolLM2 (its run: measure.py --example smollm2)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from real_configs import write_smollm2_config

from asyncflow.config.load import load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent"
RETRY = "That is not right. Answer with the number only."


@pytest.mark.timeout(30)
def test_the_smollm2_agent_config_is_a_paced_run_on_the_agents_sessions(tmp_path):
    # SmolLM2's config.json only: the config's model directory need not be imported for it to load
    model = write_smollm2_config(tmp_path / "smollm2")
    cfg = load_config(EXAMPLE / "smollm2.toml", [f"model.path={model}"])
    gw = cfg.rollout.gateway
    assert gw.enabled and gw.train and gw.pace
    assert cfg.algorithm.group_size == 8 and cfg.train.prompts_per_step == 4 and cfg.workflow.staleness == 1
    assert gw.num_sessions == cfg.train.num_steps * 4 * 8
    assert cfg.reward.functions == []  # the agent posts the rewards


def run_agent(gw, tmp_path: Path, *args: str) -> list[dict]:
    """examples/agent/agent.py against ``gw`` in its own process; its episodes (the JSON lines of its log)."""
    log = tmp_path / "agent.jsonl"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "agent.py"), "--base-url", gw.url + "/v1", *args, "--log", str(log)],
        capture_output=True,
        text=True,
        timeout=50,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # nothing of asyncflow in its process
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def rewarded(tmp_path: Path) -> dict[str, dict]:
    """The gateway's rewarded sessions (its trajectories file), by session id."""
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    return {row["session"]: row for row in rows}


@pytest.mark.timeout(60)
def test_the_add2_agent_runs_its_episodes_through_the_gateway_and_each_rewarded_session_is_what_it_saw(
    make_gateway, tokenizer, tmp_path
):
    gw = make_gateway()
    episodes = run_agent(gw, tmp_path, "--task", "add2", "--problems", "1", "--attempts", "2", "--concurrency", "1")
    assert [e["attempt"] for e in episodes] == [0, 1]
    rows = rewarded(tmp_path)
    assert sorted(rows) == ["p0-0-0", "p0-0-1"]
    for e in episodes:
        row = rows[f"p0-0-{e['attempt']}"]
        assert row["reward"] == e["reward"] and row["num_turns"] == e["turns"]
        assert e["reward"] in (1.0, 0.5, 0.0) and e["turns"] in (1, 2)
        # a wrong first answer (the tiny model's usual one): a second turn after the retry message, else right at once
        assert (e["turns"] == 2) == (e["reward"] != 1.0)
        asked = [m["content"] for m in row["messages"] if m["role"] == "user"]
        assert asked[0].startswith("What is ") and asked[0].endswith("? Answer with the number only.")
        assert asked[1:] == [RETRY] * (e["turns"] - 1)
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"] * e["turns"]
        # the retry message is context in the trained row (the gateway's chat template around it), not the prompt
        assert "What is" in tokenizer.decode(row["prompt_ids"])
        assert (RETRY in tokenizer.decode(row["response_ids"])) == (e["turns"] == 2)


@pytest.mark.timeout(60)
def test_the_calc_agent_the_default_task_still_runs_its_tool_episodes_through_the_gateway(make_gateway, tmp_path):
    gw = make_gateway()
    (episode,) = run_agent(gw, tmp_path, "--problems", "1", "--attempts", "1")
    (row,) = rewarded(tmp_path).values()
    assert row["session"] == "p0-0-0" and row["reward"] == episode["reward"] in (0.0, 1.0)
    assert row["num_turns"] == episode["turns"] and 1 <= episode["turns"] <= 3
    first = row["messages"][0]
    assert first["role"] == "user" and re.fullmatch(r"\d\d\*\d\d=", first["content"]), first
    assert [m["role"] for m in row["messages"] if m["role"] != "tool"] == ["user"] + ["assistant"] * episode["turns"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_measure_runs_the_smollm2_example_and_reports_the_reward_and_the_discarded_fraction(tiny_dir, tmp_path):
    """``measure.py --example smollm2`` as scripts/results.py runs it (record ``agent_smollm2``), with the
    tests' tiny model for SmolLM2 and one step: its JSON line has every key the record declares."""
    sys.path.insert(0, str(EXAMPLE.parents[1] / "scripts"))
    from records import BY_NAME

    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "measure.py"), "--example", "smollm2", "--out", str(tmp_path / "m")]
        + ["--set", f"model.path={tiny_dir}", "--set", "rollout.gateway.num_sessions=32"],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    for key in BY_NAME["agent_smollm2"].keys:
        value = result
        for part in key.split("."):
            value = value[part]
        assert value is not None, key
    assert result["run"]["sessions_trained"] == 32 and result["trainer"]["steps"] == 1
    assert result["run"]["sessions_stale_frac"] == result["run"]["sessions_stale"] / (32 + result["run"]["sessions_stale"])
    assert 32 <= result["agent"]["episodes"] and result["agent"]["agent_exit"] == 0
