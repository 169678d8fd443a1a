"""A run with [rollout.gateway] on: rollout.0 serves the OpenAI API while it trains."""

from __future__ import annotations

import json
import signal
import time

import openai
import pytest
from wf_helpers import afctl, read_jsonl, wait_for_steps, write_config


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("partial", [False, True], ids=["units", "partial"])
def test_a_training_run_serves_the_gateway_from_its_rollout_replica_and_keeps_training(tmp_path, partial):
    """With partial rollout the requests join the replica's stream beside its groups."""
    run_dir = tmp_path / "run"
    changes = {"rollout.gateway": {"enabled": True, "port": 0}, "workflow": {"partial_rollout": partial}}
    config = write_config(tmp_path, num_steps=200, changes=changes)
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    try:
        pointer = run_dir / "gateway.json"
        deadline = time.monotonic() + 180
        while not pointer.exists():  # written by rollout.0 once it listens
            assert proc.poll() is None, f"afctl up exited early ({proc.returncode}):\n{proc.stdout.read()}"
            assert time.monotonic() < deadline, "no RUN_DIR/gateway.json within 180 s"
            time.sleep(0.1)
        info = json.loads(pointer.read_text())
        api = openai.OpenAI(base_url=info["url"] + "/v1", api_key="unused", max_retries=0, timeout=60)
        chat = [{"role": "user", "content": "12+7="}]
        r1 = api.chat.completions.create(model="m", messages=chat, user="agent")
        chat += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "sure?"}]
        r2 = api.chat.completions.create(model="m", messages=chat, user="agent")
        wait_for_steps(run_dir, proc, 2, 180)  # training went on beside the gateway
        reward = api.post("/asyncflow/sessions/agent/reward", body={"reward": 1.0}, cast_to=object)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    reply1 = r1.model_extra["asyncflow"]["token_ids"]
    assert reward["response_ids"][: len(reply1)] == reply1
    assert reward["num_turns"] == 2 and reward["version"] == r1.model_extra["asyncflow"]["version"]
    assert r2.model_extra["asyncflow"]["version"] >= reward["version"]
    (row,) = read_jsonl(run_dir / "gateway" / "trajectories.jsonl")
    assert row == reward, out
    model = [v for v, m in zip(row["token_versions"], row["loss_mask"]) if m]
    assert model == sorted(model) and min(model) == row["version"]  # per token, never decreasing
