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
