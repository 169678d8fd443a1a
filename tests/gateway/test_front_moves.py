"""Sessions whose replica never comes back (gateway/front.py, ``move_after_s``): after the
grace the front hands the replica's sessions over to live replicas, which load them from the
dead replica's journal and go on exactly where they were (the recorded tokens, the retry of a
lost answer, a group waiting for its members); a replica restarted on that journal later
never serves them again, and a journal its replica still holds is never handed over. And the
roster (``roster``): new sessions reach a replica the online planner adds mid-run, none go to
one it removed, and the sessions of a removed replica move as soon as it is gone."""

import openai
import pytest
from test_front import api, turn
from test_gateway_journal import FakeQueue

from asyncflow.gateway.feed import SessionFeed
from asyncflow.gateway.journal import replay


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refused(client, chat: list, session: str, text: str) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="m", messages=[*chat, {"role": "user", "content": text}], user=session, max_tokens=4)
    return err.value


@pytest.mark.timeout(180)
def test_after_the_grace_a_gone_replicas_sessions_go_on_exactly_on_a_live_replica_and_its_restart_does_not_take_them_back(
    make_gateway, front_of, tmp_path
):
    journal = lambda i: tmp_path / f"journal.{i}.jsonl"  # noqa: E731
    gateways = {i: make_gateway(replica=i, journal_path=journal(i)) for i in (0, 1)}
    clock = Clock()
    front = front_of(gateways, journal_of=journal, move_after_s=60.0, clock=clock)
    client = api(front.url)
    chats = {"a": [], "b": []}
    first = {s: turn(client, chat, s, "1+1=") for s, chat in chats.items()}
    gone, live = first["a"]["replica"], first["b"]["replica"]
    assert gone != live
    before = client.get("/asyncflow/sessions/a", cast_to=object)
    gateways.pop(gone).close()  # its process is gone, and it does not come back
    assert refused(client, chats["a"], "a", "2+2=").status_code == 503  # within the grace: it may be restarting
    clock.now += 59.0
    assert refused(client, chats["a"], "a", "2+2=").status_code == 503
    clock.now += 1.0
    again = turn(client, chats["a"], "a", "2+2=")
    assert (again["replica"], again["turn"]) == (live, 2)  # on the live replica, after its recorded turn
    after = client.get("/asyncflow/sessions/a", cast_to=object)
    n = len(before["response_ids"])
    for key in ("response_ids", "rollout_logp", "loss_mask", "token_versions"):
        assert after[key][:n] == before[key], key  # the first turn exactly as recorded, never tokenised again
    assert after["prompt_ids"] == before["prompt_ids"] and after["num_turns"] == 2
    retried = client.chat.completions.create(model="m", messages=chats["a"][:-1], user="a", max_tokens=4)
    assert retried.model_extra["asyncflow"]["token_ids"] == again["token_ids"]  # a lost answer: the recorded one again
    assert client.get("/asyncflow/stats", cast_to=object)["routing"]["gateway/sessions_moved"] == 1.0

    gateways[gone] = make_gateway(replica=gone, journal_path=journal(gone))  # it came back after all
    assert gateways[gone].sessions.lookup("a") is None  # handed over: not its session any more
    assert turn(client, chats["a"], "a", "3+3=")["replica"] == live  # the session stays where it went
    assert turn(client, [], "c", "4+4=")["replica"] == gone  # new sessions may go to it again
    assert replay(journal(live)).turns["a"][0]["prompt_ids"] == before["prompt_ids"]  # its new replica journals it


@pytest.mark.timeout(180)
def test_a_journal_its_replica_still_holds_is_never_handed_over(make_gateway, front_of, tmp_path):
    """A replica that stopped answering HTTP but whose process lives (restarting, replaying its
    journal) keeps its sessions whatever the grace: two replicas never hold one session."""
    journal = lambda i: tmp_path / f"journal.{i}.jsonl"  # noqa: E731
    gateways = {i: make_gateway(replica=i, journal_path=journal(i)) for i in (0, 1)}
    front = front_of(gateways, journal_of=journal, move_after_s=0.0)
    client = api(front.url)
    chat: list = []
    held = turn(client, chat, "a", "1+1=")["replica"]
    gateways[held]._http.stop()  # no HTTP, the journal still open
    gateways[held]._http.join()
    for _ in range(2):
        assert refused(client, chat, "a", "2+2=").status_code == 503
    assert front.table.replica_of("a") == held


@pytest.mark.timeout(180)
def test_a_group_waiting_on_a_gone_replica_completes_on_the_live_one_and_is_written_once(make_gateway, front_of, tmp_path):
    journal = lambda i: tmp_path / f"journal.{i}.jsonl"  # noqa: E731
    queues = {i: FakeQueue() for i in (0, 1)}

    def gateway(i: int):
        return make_gateway(replica=i, journal_path=journal(i), feed=SessionFeed(2, 600), queue=queues[i])

    gateways = {i: gateway(i) for i in (0, 1)}
    front = front_of(gateways, journal_of=journal, move_after_s=0.0)
    client = api(front.url)
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "1+1="}], user="g-0", max_tokens=4, extra_headers={"X-Group-Id": "g"}
    )
    gone = r.model_extra["asyncflow"]["replica"]
    assert client.post("/asyncflow/sessions/g-0/reward", body={"reward": 1.0}, cast_to=object)["queue"]["waiting"] == 1
    gateways.pop(gone).close()
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "2+2="}], user="g-1", max_tokens=4, extra_headers={"X-Group-Id": "g"}
    )
    live = r.model_extra["asyncflow"]["replica"]
    assert live != gone
    done = client.post("/asyncflow/sessions/g-1/reward", body={"reward": 0.0}, cast_to=object)["queue"]
    assert sorted(done["sessions"]) == ["g-0", "g-1"]  # the group met on the live replica
    assert len(queues[live].puts) == 1 and not queues[gone].puts
    back = gateway(gone)  # restarted on its journal: g-0 is not waiting there (it would be written twice)
    assert back.feed is not None and back.feed.waiting_groups() == {}


@pytest.mark.timeout(180)
def test_new_sessions_reach_a_replica_the_roster_adds_and_a_removed_ones_sessions_move_once_it_is_gone(
    make_gateway, front_of, tmp_path
):
    journal = lambda i: tmp_path / f"journal.{i}.jsonl"  # noqa: E731
    gateways = {i: make_gateway(replica=i, journal_path=journal(i)) for i in (0, 1)}
    roster = [0, 1]
    front = front_of(gateways, journal_of=journal, move_after_s=3600.0, roster=lambda: list(roster))
    client = api(front.url)
    chats: dict[str, list] = {s: [] for s in ("a", "b", "c", "d", "e")}
    assert [turn(client, chats[s], s, "1+1=")["replica"] for s in ("a", "b")] == [0, 1]
    roster.append(2)  # the planner started rollout.2; it serves once it wrote its address
    assert turn(client, chats["c"], "c", "1+1=")["replica"] in (0, 1)  # not serving yet: never routed to
    gateways[2] = make_gateway(replica=2, journal_path=journal(2))
    assert turn(client, chats["d"], "d", "1+1=")["replica"] == 2  # the least loaded now
    roster.remove(0)  # the planner removes rollout.0: it finishes what it is doing
    assert turn(client, chats["a"], "a", "2+2=")["replica"] == 0  # still serving its sessions
    assert turn(client, chats["e"], "e", "1+1=")["replica"] in (1, 2)  # no new session on it
    gateways.pop(0).close()  # stopped: it never comes back, so no grace
    moved = turn(client, chats["a"], "a", "3+3=")
    assert moved["replica"] in (1, 2) and moved["turn"] == 3
