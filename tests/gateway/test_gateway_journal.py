"""The gateway's journal: a gateway started on the journal of one that died serves its
sessions as they were; a request sent again gets the recorded answer; rewards go into
the queue through the feed, and a queue that stays full answers a retryable 503."""

import openai
import pytest

from asyncflow.core.tq.errors import QueueFull
from asyncflow.gateway.feed import SessionFeed
from asyncflow.gateway.journal import replay


class FakeQueue:
    """A queue client that allocates rows and keeps what is put (or is full)."""

    def __init__(self, full: bool = False):
        self.full, self.puts, self.next = full, [], 0

    def allocate(self, num_groups, group_size, step=-1, timeout_s=0.0):
        from asyncflow.core.protocol import RowMeta

        if self.full:
            raise QueueFull("no room")
        metas = [RowMeta(index=self.next + k, group_id=self.next, group_size=group_size, step=step) for k in range(group_size)]
        self.next += group_size
        return metas

    def put(self, indices, columns, metas):
        self.puts.append((indices, columns, metas))


def api(gw):
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.mark.timeout(120)
def test_a_gateway_started_on_the_journal_continues_its_sessions_and_answers_a_retry_with_the_recorded_reply(
    make_gateway, tmp_path
):
    journal = tmp_path / "journal.jsonl"
    first = make_gateway(journal_path=journal)
    chat = [{"role": "user", "content": "12+7="}]
    r1 = api(first).chat.completions.create(model="m", messages=chat, user="s")
    first.close()  # the replica died: its memory is gone, its journal stays
    second = make_gateway(journal_path=journal)
    chat += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "7+1="}]
    r2 = api(second).chat.completions.create(model="m", messages=chat, user="s")
    again = api(second).chat.completions.create(model="m", messages=chat, user="s")
    assert r2.model_extra["asyncflow"]["turn"] == 2
    assert again.model_extra["asyncflow"]["token_ids"] == r2.model_extra["asyncflow"]["token_ids"]
    assert again.choices[0].message.content == r2.choices[0].message.content
    t = second.sessions.get("s")
    t1 = r1.model_extra["asyncflow"]["token_ids"]
    assert t.response_ids[: len(t1)] == t1 and t.loss_mask[: len(t1)] == [1] * len(t1) and t.num_turns == 2
    assert set(replay(journal).turns) == {"s"}


@pytest.mark.timeout(120)
def test_rewards_go_into_the_queue_by_group_and_a_full_queue_answers_503_with_the_session_left_open(make_gateway, tmp_path):
    queue = FakeQueue()
    gw = make_gateway(journal_path=tmp_path / "j.jsonl", feed=SessionFeed(2, 60), queue=queue, write_timeout_s=0.1)
    c = api(gw)
    for s in ("a", "b", "lone"):
        headers = {"X-Group-Id": "g"} if s != "lone" else {}
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "1+1="}], user=s, extra_headers=headers)
    assert c.post("/asyncflow/sessions/a/reward", body={"reward": 1.0}, cast_to=object)["queue"]["waiting"] == 1
    done = c.post("/asyncflow/sessions/b/reward", body={"reward": 0.0}, cast_to=object)["queue"]
    assert done["sessions"] == ["a", "b"] and done["written"] == [0, 1]
    ((indices, columns, metas),) = queue.puts
    assert [float(r[0]) for r in columns["reward"]] == [1.0, 0.0] and {m.group_id for m in metas} == {0}
    queue.full = True
    with pytest.raises(openai.APIStatusError) as refused:
        c.post("/asyncflow/sessions/lone/reward", body={"reward": 1.0}, cast_to=object)
    assert refused.value.status_code == 503 and refused.value.response.headers["retry-after"] == "5"
    queue.full = False
    assert c.post("/asyncflow/sessions/lone/reward", body={"reward": 1.0}, cast_to=object)["queue"]["written"] == [2]
    with pytest.raises(openai.APIStatusError) as finished:  # trained on: finished for good
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "1+1="}], user="a")
    assert finished.value.status_code == 409


@pytest.mark.timeout(30)
def test_a_journal_is_held_while_its_gateway_lives_and_a_handover_closes_its_sessions_there(tmp_path):
    """Only a journal nobody holds (its replica's process is gone) may be handed over; the
    sessions handed over are finished for good in it, so a replica restarted on it later
    never serves (nor writes to the queue) a session another replica took."""
    from asyncflow.gateway.journal import Journal

    path = tmp_path / "j.jsonl"
    live = Journal(path)
    live.append("turn", s="a", prompt_ids=[1], request=[], context=[], reply=[2], logp=[0.0], text="", finish="stop", v=0, d=0)
    live.append("turn", s="b", prompt_ids=[1], request=[], context=[], reply=[2], logp=[0.0], text="", finish="stop", v=0, d=0)
    assert Journal.claim(path) is None  # its replica lives
    live.close()
    claimed = Journal.claim(path)
    assert claimed is not None
    claimed.append("moved", s=["a"], to={"a": 1})
    assert Journal.claim(path) is None  # one handover at a time
    claimed.close()
    state = replay(path)
    assert set(state.turns) == {"b"} and state.closed == {"a"}


@pytest.mark.timeout(60)
def test_the_journal_of_a_replica_process_is_claimed_only_once_that_process_is_killed(tmp_path):
    """Across processes, as in a run: the front cannot claim the journal of a live replica
    process, and can once it is killed with -9 (the kernel releases its lock)."""
    import os
    import signal
    import subprocess
    import sys

    from asyncflow.gateway.journal import Journal

    path = tmp_path / "j.jsonl"
    holder = (
        "import sys; from asyncflow.gateway.journal import Journal; "
        "j = Journal(sys.argv[1]); print('held', flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", holder, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        assert Journal.claim(path) is None
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        claimed = Journal.claim(path)
        assert claimed is not None
        claimed.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def anonymous_turn(gw) -> str:
    """One request that names no session; the id the gateway made up for it."""
    raw = api(gw).chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "2+2="}])
    return raw.headers["x-session-id"]


@pytest.mark.timeout(120)
def test_a_replica_restarted_after_more_anonymous_requests_than_max_sessions_serves_what_its_store_held(make_gateway, tmp_path):
    """Anonymous sessions dropped to make room stay dropped across a restart, and the ones
    kept stay anonymous: the restarted replica starts, holds the sessions the dead one held,
    and still drops an anonymous one to make room for a named one."""
    journal = tmp_path / "journal.jsonl"
    first = make_gateway(journal_path=journal, max_sessions=3)
    api(first).chat.completions.create(model="m", messages=[{"role": "user", "content": "1+1="}], user="agent-a")
    anonymous = [anonymous_turn(first) for _ in range(6)]  # twice what the store holds
    held = first.sessions.ids()
    assert held == ["agent-a", *anonymous[-2:]]
    first.close()  # the replica died
    second = make_gateway(journal_path=journal, max_sessions=3)
    assert second.sessions.ids() == held
    api(second).chat.completions.create(model="m", messages=[{"role": "user", "content": "3+3="}], user="agent-b")
    assert second.sessions.ids() == ["agent-a", anonymous[-1], "agent-b"]  # an anonymous one made room
    newest = anonymous_turn(second)
    assert second.sessions.ids() == ["agent-a", "agent-b", newest]
    second.close()
    third = make_gateway(journal_path=journal, max_sessions=3)  # and again, after the second replica's evictions
    assert third.sessions.ids() == ["agent-a", "agent-b", newest]


@pytest.mark.timeout(120)
def test_a_rewarded_session_dropped_from_the_store_still_waits_for_its_group_after_a_restart(make_gateway, tmp_path):
    """A finished session the store dropped to make room is no longer served, but its reward,
    answered as waiting for its group, still completes the group after a restart."""
    journal, queue = tmp_path / "journal.jsonl", FakeQueue()
    first = make_gateway(journal_path=journal, max_sessions=2, feed=SessionFeed(2, 60), queue=queue)
    c = api(first)
    c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "1+1="}], user="a", extra_headers={"X-Group-Id": "g"}
    )
    assert c.post("/asyncflow/sessions/a/reward", body={"reward": 1.0}, cast_to=object)["queue"]["waiting"] == 1
    anonymous_turn(first)
    anonymous_turn(first)  # the finished "a" made room
    assert "a" not in first.sessions.ids()
    first.close()
    second = make_gateway(journal_path=journal, max_sessions=2, feed=SessionFeed(2, 60), queue=queue)
    assert "a" not in second.sessions.ids()
    c = api(second)
    c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "1+1="}], user="b", extra_headers={"X-Group-Id": "g"}
    )
    done = c.post("/asyncflow/sessions/b/reward", body={"reward": 0.0}, cast_to=object)["queue"]
    assert done["sessions"] == ["a", "b"]


@pytest.mark.timeout(120)
def test_a_replica_restarts_on_a_journal_holding_more_named_sessions_than_max_sessions(make_gateway, tmp_path):
    """A replica restarts whatever its journal holds (``max_sessions`` lowered on a resume):
    every open session is served; new ones are refused with the 429 that says what to do."""
    journal = tmp_path / "journal.jsonl"
    first = make_gateway(journal_path=journal, max_sessions=3)
    for s in ("a", "b", "c"):
        api(first).chat.completions.create(model="m", messages=[{"role": "user", "content": "1+1="}], user=s)
    first.close()
    second = make_gateway(journal_path=journal, max_sessions=2)
    assert second.sessions.ids() == ["a", "b", "c"]
    with pytest.raises(openai.APIStatusError) as refused:
        api(second).chat.completions.create(model="m", messages=[{"role": "user", "content": "1+1="}], user="d")
    assert refused.value.status_code == 429


@pytest.mark.timeout(120)
def test_anonymous_sessions_handed_over_to_a_full_replica_are_taken_and_stay_anonymous(make_gateway, tmp_path):
    """A replica that takes over another's sessions takes them all, even past its
    ``max_sessions``, and the anonymous ones among them still make room for new sessions."""
    from asyncflow.gateway.handover import take_over

    gone_journal = tmp_path / "gone.jsonl"
    gone = make_gateway(journal_path=gone_journal, max_sessions=4)
    moved = [anonymous_turn(gone) for _ in range(2)]
    gone.close()  # its process is gone, and it does not come back
    live = make_gateway(journal_path=tmp_path / "live.jsonl", max_sessions=2)
    api(live).chat.completions.create(model="m", messages=[{"role": "user", "content": "1+1="}], user="agent-a")
    handovers = take_over(gone_journal, 0, lambda groups, done: dict.fromkeys(groups, 1))
    assert handovers is not None
    assert live.adopt(handovers[1]) == sorted(moved)
    assert live.sessions.ids() == ["agent-a", *moved]  # over max_sessions: none refused
    api(live).chat.completions.create(model="m", messages=[{"role": "user", "content": "1+1="}], user="agent-b")
    assert live.sessions.ids() == ["agent-a", "agent-b"]  # both anonymous ones made room
