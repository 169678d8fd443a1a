"""Runs that train on the gateway's rewarded sessions ([rollout.gateway] train): each
session trained exactly once, grouped by key; a kill -9 of the serving replica
mid-session loses nothing (its journal is served by the restarted replica)."""

from __future__ import annotations

import json
import os
import signal
import time

import openai
import pytest
from wf_helpers import afctl, child_hosts, read_jsonl, write_config


def sessions_config(tmp_path, num_sessions: int, partial: bool = False, **gateway):
    """``gateway``: more ``[rollout.gateway]`` keys."""
    return write_config(
        tmp_path,
        num_steps=1,
        changes={
            "algorithm": {"group_size": 2},
            "train": {"prompts_per_step": 2},  # 4 sessions a step
            "rollout.gateway": {"enabled": True, "port": 0, "train": True, "num_sessions": num_sessions, **gateway},
            "reward": {"functions": []},
            "workflow": {"partial_rollout": partial},  # the gateway's requests join the replica's stream
        },
    )


def wait_for_gateway(run_dir, proc, newer_than_ns: int = -1, timeout_s: float = 180) -> str:
    """The gateway's URL once RUN_DIR/gateway.json is written (after ``newer_than_ns``: by a restarted replica)."""
    pointer = run_dir / "gateway.json"
    deadline = time.monotonic() + timeout_s
    while not (pointer.exists() and pointer.stat().st_mtime_ns > newer_than_ns):  # written once the gateway listens
        assert proc.poll() is None, f"afctl up exited early ({proc.returncode}):\n{proc.stdout.read()}"
        assert time.monotonic() < deadline, f"no new RUN_DIR/gateway.json within {timeout_s} s"
        time.sleep(0.1)
    return json.loads(pointer.read_text())["url"] + "/v1"


def wait_for_line(proc, text: str) -> list[str]:
    """afctl's output up to and including the line that holds ``text`` (the driver printed it)."""
    lines = []
    while not lines or text not in lines[-1]:
        line = proc.stdout.readline()
        assert line, f"afctl up ended before printing {text!r}:\n{''.join(lines)}"
        lines.append(line)
    return lines


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def one_turn(api: openai.OpenAI, session: str, group: str | None = None, text: str = "12+7="):
    headers = {"X-Group-Id": group} if group else {}
    return api.chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}], user=session, extra_headers=headers
    )


def reward(api: openai.OpenAI, session: str, value: float) -> dict:
    return api.post(f"/asyncflow/sessions/{session}/reward", body={"reward": value}, cast_to=object)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("partial", [False, True], ids=["units", "partial"])
def test_rewarded_sessions_are_trained_exactly_once_keyed_ones_as_one_group_and_lone_ones_alone(tmp_path, partial):
    run_dir = tmp_path / "run"
    proc = afctl("up", str(sessions_config(tmp_path, num_sessions=8, partial=partial)), "--run-dir", str(run_dir))
    try:
        api = client(wait_for_gateway(run_dir, proc))
        plan = [
            ("a-0", "a"),
            ("a-1", "a"),
            ("l-0", None),
            ("l-1", None),
            ("b-0", "b"),
            ("l-2", None),
            ("b-1", "b"),
            ("l-3", None),
        ]
        for session, group in plan:
            one_turn(api, session, group)
        written = {}
        for k, (session, _) in enumerate(plan):
            queued = reward(api, session, float(k % 2))["queue"]
            if "written" in queued:
                written.update(zip(queued["sessions"], queued["written"]))
        out, _ = proc.communicate(timeout=240)  # the run ends by itself after num_sessions
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    # the replica takes the trainer's weight announcements (it had no rollout task to wake: they failed)
    assert "could not tell rollout.0" not in out and "failed on urgent WeightsReady" not in out, out
    assert sorted(written) == sorted(s for s, _ in plan)
    lines = read_jsonl(run_dir / "trained.jsonl")
    trained = [i for line in lines for i in line["indices"]]
    assert sorted(trained) == sorted(written.values()) and len(set(trained)) == len(trained)  # each once
    assert all(line["stale_sessions"] == [] == line["stale_session_ids"] for line in lines)
    by_id = {s: i for line in lines for s, i in zip(line["sessions"], line["indices"])}  # what an audit joins on
    assert by_id == written
    group_of = {i: g for line in lines for i, g in zip(line["indices"], line["groups"])}
    assert group_of[written["a-0"]] == group_of[written["a-1"]] != group_of[written["b-0"]] == group_of[written["b-1"]]
    lone = [group_of[written[f"l-{j}"]] for j in range(4)]
    assert len(set(lone)) == 4 and not set(lone) & {group_of[written["a-0"]], group_of[written["b-0"]]}


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("partial", [False, True], ids=["units", "partial"])
def test_a_session_survives_a_kill_9_of_its_serving_replica_and_is_trained_once(tmp_path, partial):
    run_dir = tmp_path / "run"
    proc = afctl("up", str(sessions_config(tmp_path, num_sessions=4, partial=partial)), "--run-dir", str(run_dir))
    try:
        url = wait_for_gateway(run_dir, proc)
        wait_for_line(proc, "every process is up")  # every role started its work: a death now is a restart
        born = (run_dir / "gateway.json").stat().st_mtime_ns
        chat = [{"role": "user", "content": "12+7="}]
        r1 = client(url).chat.completions.create(model="m", messages=chat, user="survivor")
        os.kill(child_hosts(proc.pid)["rollout.0"], signal.SIGKILL)  # mid-session: its first turn is recorded
        api = client(wait_for_gateway(run_dir, proc, newer_than_ns=born))  # the restarted replica serves again
        chat += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "7+1="}]
        r2 = api.chat.completions.create(model="m", messages=chat, user="survivor")
        again = api.chat.completions.create(model="m", messages=chat, user="survivor")  # a retry: the same answer
        for k in range(3):
            one_turn(api, f"other-{k}")
        row = reward(api, "survivor", 1.0)
        for k in range(3):
            reward(api, f"other-{k}", 0.0)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    t1 = r1.model_extra["asyncflow"]["token_ids"]
    assert r2.model_extra["asyncflow"]["turn"] == 2  # continued, not started afresh
    assert again.model_extra["asyncflow"]["token_ids"] == r2.model_extra["asyncflow"]["token_ids"]
    assert row["num_turns"] == 2 and row["response_ids"][: len(t1)] == t1 and row["loss_mask"][: len(t1)] == [1] * len(t1)
    (index,) = row["queue"]["written"]
    trained = [i for line in read_jsonl(run_dir / "trained.jsonl") for i in line["indices"]]
    assert trained.count(index) == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "rollout.0" in json.dumps(summary.get("restarts", summary))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sessions_sent_all_at_once_that_go_stale_are_named_in_a_warning_with_the_fix(tmp_path):
    """An agent that sends every session before the first step (the SmolLM2 agent run did):
    at staleness 1, step 2 discards the version-0 sessions left, and the run waits for more.
    Before, nothing said so; the stall report showed an empty task."""
    run_dir = tmp_path / "run"
    proc = afctl("up", str(sessions_config(tmp_path, num_sessions=12)), "--run-dir", str(run_dir))  # 3 steps of 4
    try:
        api = client(wait_for_gateway(run_dir, proc))
        for k in range(12):
            one_turn(api, f"s{k}")
        for k in range(12):
            reward(api, f"s{k}", float(k % 2))
        lines = wait_for_line(proc, "discarded")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    warning = lines[-1]
    assert "4 gateway sessions" in warning and "workflow.staleness" in warning and "num_sessions" in warning, warning


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_replica_killed_after_more_anonymous_requests_than_max_sessions_restarts_and_serves_what_it_held(tmp_path):
    """Anonymous requests fill the store (and make room for each other); a kill -9 of the
    serving replica then restarts it with the sessions its store held, the anonymous ones
    still anonymous: they make room for new named sessions, and the run trains to its end."""
    run_dir = tmp_path / "run"
    proc = afctl("up", str(sessions_config(tmp_path, num_sessions=4, max_sessions=3)), "--run-dir", str(run_dir))
    try:
        url = wait_for_gateway(run_dir, proc)
        wait_for_line(proc, "every process is up")  # every role started its work: a death now is a restart
        born = (run_dir / "gateway.json").stat().st_mtime_ns
        chat = [{"role": "user", "content": "12+7="}]
        r1 = client(url).chat.completions.create(model="m", messages=chat, user="named")
        for _ in range(6):  # twice what the store holds: anonymous ones make room for each other
            client(url).chat.completions.create(model="m", messages=[{"role": "user", "content": "1+1="}])
        os.kill(child_hosts(proc.pid)["rollout.0"], signal.SIGKILL)
        api = client(wait_for_gateway(run_dir, proc, newer_than_ns=born))  # the restarted replica serves again
        chat += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "7+1="}]
        assert api.chat.completions.create(model="m", messages=chat, user="named").model_extra["asyncflow"]["turn"] == 2
        one_turn(api, "new-0")  # room made by the restored anonymous sessions
        one_turn(api, "new-1")
        written = [reward(api, s, 1.0)["queue"]["written"] for s in ("named", "new-0", "new-1")]
        one_turn(api, "new-2")  # room made by a rewarded one
        written.append(reward(api, "new-2", 0.0)["queue"]["written"])
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    indices = [i for w in written for i in w]
    trained = [i for line in read_jsonl(run_dir / "trained.jsonl") for i in line["indices"]]
    assert sorted(trained) == sorted(indices) and len(indices) == 4
