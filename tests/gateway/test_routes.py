"""The front's routing table (gateway/routes.py): sticky sessions, groups kept together,
new sessions on the least-loaded live replica, a session whose replica is down refused."""

import pytest

from asyncflow.gateway.routes import ReplicaDown, RouteTable


@pytest.mark.timeout(10)
def test_a_new_session_goes_to_the_least_loaded_live_replica_and_its_later_turns_stay_there():
    table = RouteTable([0, 1])
    first = [table.route(f"s{i}") for i in range(4)]
    assert first == [0, 1, 0, 1]
    assert [table.route(f"s{i}") for i in range(4)] == first  # sticky
    table.finished("s0")
    assert table.route("new") == 0  # replica 0 holds one open session now, replica 1 two


@pytest.mark.timeout(10)
def test_sessions_of_one_group_go_to_the_replica_of_its_first_session():
    table = RouteTable([0, 1])
    assert table.route("a-0", group="a") == 0
    assert table.route("x") == 1
    assert table.route("y") == 0
    assert table.route("a-1", group="a") == 0  # with its group, not on the least-loaded
    assert table.group_replica("a") == 0 and table.group_replica("b") is None


@pytest.mark.timeout(10)
def test_a_session_whose_replica_is_down_is_refused_until_it_is_back_and_new_sessions_avoid_it():
    table = RouteTable([0, 1])
    assert table.route("s") == 0
    table.down(0)
    with pytest.raises(ReplicaDown) as err:
        table.route("s")
    assert err.value.replica == 0
    assert table.route("t") == 1 and table.route("u") == 1  # new sessions only on live replicas
    table.up(0)
    assert table.route("s") == 0


@pytest.mark.timeout(10)
def test_a_new_session_of_a_group_whose_replica_is_down_is_refused_too():
    table = RouteTable([0, 1])
    assert table.route("a-0", group="a") == 0
    table.down(0)
    with pytest.raises(ReplicaDown):
        table.route("a-1", group="a")


@pytest.mark.timeout(10)
def test_with_every_replica_down_a_new_session_is_refused():
    table = RouteTable([0, 1])
    table.down(0)
    table.down(1)
    with pytest.raises(ReplicaDown):
        table.route("s")


@pytest.mark.timeout(10)
def test_round_robin_sends_each_request_to_the_next_replica_whatever_its_session():
    table = RouteTable([0, 1, 2], policy="round_robin")
    assert [table.route("s") for _ in range(4)] == [0, 1, 2, 0]


@pytest.mark.timeout(10)
def test_a_replica_down_past_the_grace_is_due_to_hand_over_its_sessions_and_a_retired_one_at_once():
    table = RouteTable([0, 1, 2])
    table.down(0, now=100.0)
    assert table.due(now=150.0, grace_s=60.0) == []  # restarting in place, perhaps: its sessions wait
    assert table.due(now=160.0, grace_s=60.0) == [0]
    assert table.due(now=1e9, grace_s=None) == []  # None: sessions wait for their replica forever
    table.set_roster([1, 2])  # the run no longer has replica 0 (the online planner removed it)
    assert table.due(now=100.0, grace_s=60.0) == [0]  # it never comes back: no grace
    table.up(1)
    assert table.due(now=100.0, grace_s=None) == [0]


@pytest.mark.timeout(10)
def test_a_handed_over_replicas_sessions_go_to_live_replicas_a_group_together_and_finished_ones_not_counted_open():
    table = RouteTable([0, 1, 2])
    for s, r, g in (("a", 0, "g"), ("b", 0, "g"), ("done", 0, None), ("x", 1, None), ("y", 2, None)):
        table.pin(s, r, g)
    table.finished("done")
    table.down(0, now=0.0)
    moved = table.hand_over(0, {"a": "g", "b": "g", "done": None}, finished={"done"})
    assert moved["a"] == moved["b"] in (1, 2) and table.replica_of("a") == moved["a"]
    assert table.group_replica("g") == moved["a"]  # the group's later sessions meet its moved ones
    assert table.replica_of("done") == moved["done"]  # a finished session is still answered (409, its trajectory)
    assert table.due(now=1e9, grace_s=1.0) == []  # handed over once
    counts = table.counts()
    assert counts["gateway/open_sessions_0"] == 0.0 and counts["gateway/sessions_moved"] == 3.0
    assert sum(counts[f"gateway/open_sessions_{r}"] for r in (1, 2)) == 4.0  # a, b, x, y: "done" is not open
    table.up(0)  # it came back after all: new sessions may go there, the moved ones stay where they went
    assert table.route("a") == moved["a"] and table.route("new") == 0


@pytest.mark.timeout(10)
def test_with_no_live_replica_nothing_is_handed_over():
    table = RouteTable([0, 1])
    table.route("s")
    table.down(0, now=0.0)
    table.down(1, now=0.0)
    with pytest.raises(ReplicaDown):
        table.hand_over(0, {"s": None})
    assert table.replica_of("s") == 0 and table.due(now=10.0, grace_s=1.0) == [0, 1]


@pytest.mark.timeout(10)
def test_the_roster_adds_replicas_new_sessions_reach_and_a_removed_one_gets_no_new_session():
    table = RouteTable([0, 1])
    assert [table.route(s) for s in ("a", "b")] == [0, 1]
    table.set_roster([0, 1, 2])  # the online planner started rollout.2
    assert table.route("c") == 2
    table.set_roster([0, 2])  # and removed rollout.1
    assert table.route("b") == 1  # still serving: its sessions stay until it is gone
    assert {table.route(s) for s in ("d", "e", "f", "g")} == {0, 2}
    assert table.replicas == [0, 1, 2]
