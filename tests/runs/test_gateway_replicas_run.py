"""A run that trains on gateway sessions served by two rollout replicas behind one URL
([rollout.gateway] all_replicas): every turn of a session lands on one replica, a
group's sessions on one replica, and after a kill -9 of a session's replica its next turn
is refused with a retryable 503 until the restarted replica serves it again, where it
was; every session is trained exactly once."""

from __future__ import annotations

import json
import os
import signal

import openai
import pytest
from test_gateway_sessions_run import wait_for_gateway, wait_for_line
from wf_helpers import afctl, child_hosts, read_jsonl, write_config


def replicas_config(tmp_path, num_sessions: int):
    return write_config(
        tmp_path,
        num_steps=1,
        changes={
            "algorithm": {"group_size": 2},
            "train": {"prompts_per_step": 2},  # 4 sessions a step
            "rollout": {"num_replicas": 2},
            "rollout.gateway": {"enabled": True, "port": 0, "train": True, "num_sessions": num_sessions, "all_replicas": True},
            "reward": {"functions": []},
        },
    )


def client(url: str, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=retries, timeout=60)


def turn(api: openai.OpenAI, chat: list, session: str, group: str | None = None) -> dict:
    chat.append({"role": "user", "content": f"{len(chat)}+7="})
    headers = {"X-Group-Id": group} if group else {}
    r = api.chat.completions.create(model="m", messages=chat, user=session, extra_headers=headers)
    chat.append({"role": "assistant", "content": r.choices[0].message.content})
    return r.model_extra["asyncflow"]


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_sessions_stick_to_their_replica_survive_its_kill_9_there_and_are_trained_once(tmp_path):
    run_dir = tmp_path / "run"
    proc = afctl("up", str(replicas_config(tmp_path, num_sessions=8)), "--run-dir", str(run_dir))
    try:
        url = wait_for_gateway(run_dir, proc)
        assert "2 rollout replicas, sticky sessions" in wait_for_line(proc, "gateway: OpenAI-compatible API")[-1]
        api = client(url)
        chats = {s: [] for s in ("s0", "s1", "s2", "s3", "g-0", "g-1", "l-0", "l-1")}
        served: dict[str, set] = {s: set() for s in chats}
        for _ in range(2):
            for s in ("s0", "s1", "s2", "s3"):
                served[s].add(turn(api, chats[s], s)["replica"])
        for s in ("g-0", "g-1"):
            served[s].add(turn(api, chats[s], s, group="g")["replica"])
        assert all(len(r) == 1 for r in served.values() if r), served  # every turn of a session on one replica
        assert {next(iter(served[s])) for s in ("s0", "s1", "s2", "s3")} == {0, 1}
        assert served["g-0"] == served["g-1"]  # a group meets on one replica
        reused = api.get("/asyncflow/stats", cast_to=object)["total"]["gateway/prefix_reused_tokens"]
        assert reused > 0

        (victim,) = served["s0"]
        other = next(s for s in ("s1", "s2", "s3") if served[s] != {victim})
        os.kill(child_hosts(proc.pid)[f"rollout.{victim}"], signal.SIGKILL)  # its sessions' turns are journaled
        assert turn(api, chats[other], other)["replica"] == 1 - victim  # the live replica serves on
        chats["s0"].append({"role": "user", "content": "1+1="})
        try:  # the restarted replica cannot be up yet (its process starts torch): a retryable 503
            api.chat.completions.create(model="m", messages=chats["s0"], user="s0")
            refused = None
        except openai.APIStatusError as exc:
            refused = exc
        chats["s0"].pop()
        assert refused is not None and refused.status_code == 503, refused
        assert refused.response.headers["retry-after"] == "5" and f"rollout.{victim}" in refused.message
        again = turn(client(url, retries=40), chats["s0"], "s0")  # the client retries until the replica is back
        assert (again["replica"], again["turn"]) == (victim, 3)  # where it was, the conversation continued

        for s in ("l-0", "l-1"):
            turn(api, chats[s], s)
        written = {}
        for k, s in enumerate(chats):
            queued = api.post(f"/asyncflow/sessions/{s}/reward", body={"reward": float(k % 2)}, cast_to=object)["queue"]
            written.update(zip(queued.get("sessions", []), queued.get("written", [])))
        out, _ = proc.communicate(timeout=300)  # the run ends by itself after num_sessions
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert sorted(written) == sorted(chats)
    trained = [i for line in read_jsonl(run_dir / "trained.jsonl") for i in line["indices"]]
    assert sorted(trained) == sorted(written.values())  # each session once
    summary = json.loads((run_dir / "summary.json").read_text())
    assert f"rollout.{victim}" in json.dumps(summary.get("restarts", summary))
