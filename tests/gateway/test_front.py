"""The front before several replicas' gateways (gateway/front.py): every turn of a
session lands on one replica, whose prefix reuse it counts and whose prefix cache serves it; a replica that is gone
refuses its sessions with a retryable 503 until it is back (restarted on its journal),
and new sessions go to the live ones."""

import openai
import pytest

from asyncflow.gateway.front import Front


def api(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def turn(client, chat: list, session: str, text: str):
    chat.append({"role": "user", "content": text})
    r = client.chat.completions.create(model="m", messages=chat, user=session, max_tokens=4)
    chat.append({"role": "assistant", "content": r.choices[0].message.content})
    return {**r.model_extra["asyncflow"], "prompt_tokens": r.usage.prompt_tokens, "reply_tokens": r.usage.completion_tokens}


@pytest.mark.timeout(180)
def test_every_turn_of_a_session_lands_on_one_replica_and_its_earlier_turns_count_as_reused_there(make_gateway, front_of):
    gateways = {i: make_gateway(replica=i) for i in (0, 1)}
    front = front_of(gateways)
    client = api(front.url)
    chats = {f"s{i}": [] for i in range(4)}
    turns: dict[str, list] = {s: [] for s in chats}
    for k in range(3):
        for s, chat in chats.items():
            turns[s].append(turn(client, chat, s, f"{k}+1="))
    served = {s: {t["replica"] for t in ts} for s, ts in turns.items()}
    assert all(len(r) == 1 for r in served.values()), served
    assert set().union(*served.values()) == {0, 1}  # both replicas serve
    total = client.get("/asyncflow/stats", cast_to=object)["total"]
    assert total["gateway/prompt_tokens"] == sum(t["prompt_tokens"] for ts in turns.values() for t in ts)
    # every turn after the first reuses the turn before it: its prompt and its reply but the last token
    reused = sum(a["prompt_tokens"] + a["reply_tokens"] - 1 for ts in turns.values() for a in ts[:-1])
    assert total["gateway/prefix_reused_tokens"] == total["gateway/prefix_reused_same_version_tokens"] == reused
    # the replica's prefix cache served at least the whole 16-token blocks of each reused prefix (nothing evicted,
    # no new weights), and never a turn's last prompt token
    blocks = sum(
        min(a["prompt_tokens"] + a["reply_tokens"] - 1, b["prompt_tokens"] - 1) // 16 * 16
        for ts in turns.values()
        for a, b in zip(ts, ts[1:])
    )
    assert blocks > 0
    assert blocks <= total["gateway/prefix_cached_tokens"] <= sum(t["prompt_tokens"] - 1 for ts in turns.values() for t in ts)
    assert sorted(client.get("/asyncflow/sessions", cast_to=object)["sessions"]) == sorted(chats)


@pytest.mark.timeout(180)
def test_a_session_whose_replica_is_gone_gets_a_retryable_503_until_it_is_back_on_its_journal(make_gateway, front_of, tmp_path):
    gateways = {i: make_gateway(replica=i, journal_path=tmp_path / f"journal.{i}.jsonl") for i in (0, 1)}
    front = front_of(gateways)
    client = api(front.url)
    chats = {"a": [], "b": []}
    where = {s: turn(client, chat, s, "1+1=")["replica"] for s, chat in chats.items()}
    assert sorted(where.values()) == [0, 1]
    gone = where["a"]
    gateways[gone].close()  # the replica's process is gone: its address refuses connections
    chats["a"].append({"role": "user", "content": "2+2="})
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="m", messages=chats["a"], user="a", max_tokens=4)
    assert refused.value.status_code == 503
    assert refused.value.response.headers["retry-after"] == "5"
    assert f"rollout.{gone}" in refused.value.message and "again" in refused.value.message
    chats["a"].pop()
    assert turn(client, chats["b"], "b", "3+3=")["replica"] == where["b"]  # the live replica serves on
    assert turn(client, [], "c", "4+4=")["replica"] == where["b"]  # a new session goes to the live one
    gateways[gone] = make_gateway(replica=gone, journal_path=tmp_path / f"journal.{gone}.jsonl")  # restarted in place
    again = turn(client, chats["a"], "a", "2+2=")
    assert (again["replica"], again["turn"]) == (gone, 2)  # the conversation goes on where it was


@pytest.mark.timeout(60)
def test_a_request_for_a_session_the_front_never_routed_is_a_404(make_gateway, front_of):
    front = front_of({0: make_gateway(replica=0)})
    with pytest.raises(openai.NotFoundError):
        api(front.url).get("/asyncflow/sessions/nobody", cast_to=object)


@pytest.mark.timeout(120)
def test_an_anonymous_session_stays_on_the_replica_that_named_it_and_an_oversized_body_is_a_413(make_gateway, front_of):
    gateways = {i: make_gateway(replica=i) for i in (0, 1)}
    front = front_of(gateways)
    client = api(front.url)
    chat = [{"role": "user", "content": "1+1="}]
    first = client.chat.completions.with_raw_response.create(model="m", messages=chat, max_tokens=4)
    named, replica = first.headers["x-session-id"], first.parse().model_extra["asyncflow"]["replica"]
    chat.append({"role": "assistant", "content": first.parse().choices[0].message.content})
    later = [turn(client, [*chat], named, "2+2=")["replica"] for _ in range(1)]
    assert later == [replica]
    assert front.table.counts()[f"gateway/open_sessions_{replica}"] == 1.0  # the anonymous placeholder is gone
    with pytest.raises(openai.APIStatusError) as big:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "1" * (1 << 20)}])
    assert big.value.status_code == 413


@pytest.mark.timeout(60)
def test_a_replica_that_accepts_the_connection_but_never_answers_gets_a_504_not_a_hung_client():
    """A frozen replica (SIGSTOP, a stuck engine) keeps its socket open: the front gives up after
    ``request_timeout_s`` with a 504 naming the key, and its next request goes the same way
    (the replica is slow, not gone: its sessions stay on it)."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:  # accepts and reads nothing, answers nothing
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    front = Front([0], lambda i: url, request_timeout_s=0.5)
    front.start("127.0.0.1", 0)
    try:
        client = api(front.url)
        for _ in range(2):
            with pytest.raises(openai.APIStatusError) as err:
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "1+1="}], user="s0")
            assert err.value.status_code == 504
            assert "request_timeout_s" in err.value.message and "rollout.0" in err.value.message
        assert not front.table.is_down(0)
    finally:
        front.close()
        stop.set()
        for s in held:
            s.close()
        listener.close()
