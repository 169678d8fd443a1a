"""Weight fan-out through the replicas (``[workflow] weight_fanout = "tree"``,
actors/weights/_relay.py): the layout and the relay's state alone, then real fleets:
the ``weights`` actor and roster in this process, light replicas (``bench/fanout.py``:
a rollout replica's weight path, inbox, receiver, relay, swap and digest check) in
process hosts, on real ipc nng sockets. A relay killed or frozen mid-transfer is one
process of its own whose fetch stops at a chosen chunk (``_fanout_victim.py``), so the
order is forced, not timed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from asyncflow.actors.runtime import messages
from asyncflow.actors.weights import relay_name, tree_levels, tree_sources
from asyncflow.actors.weights._relay import MAX_SOURCES, RelayStore
from asyncflow.bench.fanout import Fleet, fanout_run_dir, tensors_crc32, version_tensors
from asyncflow.config.load import ConfigError, load_config_text
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.protocol import Tensor
from asyncflow.core.transport import TransportConfig
from asyncflow.planner.cost import tree_depth

HERE = Path(__file__).resolve().parent
VERSION_BYTES, TENSOR_BYTES, CHUNK_BYTES = 256 << 10, 32 << 10, 16 << 10  # 8 tensors, 16 chunks (tensors cut in two)


@pytest.mark.timeout(10)
def test_tree_sources_name_each_replicas_ancestors_nearest_first_and_only_degree_replicas_pull_from_the_root():
    names = [f"rollout.{i}" for i in range(8)]
    sources = tree_sources(names, 2)
    assert sources["rollout.0"] == sources["rollout.1"] == []  # the root's children
    assert sources["rollout.2"] == sources["rollout.3"] == [relay_name("rollout.0")]
    assert sources["rollout.4"] == [relay_name("rollout.1")]
    assert sources["rollout.7"] == [relay_name("rollout.2"), relay_name("rollout.0")]
    assert relay_name("rollout.3") == "relay.rollout.3"
    assert [tree_depth(n, 2) for n in (1, 2, 3, 6, 7, 128)] == [1, 1, 2, 2, 3, 7]
    for n, d in ((128, 2), (100, 3), (9, 1)):  # the planner's depth (planner/cost.py) is the layout's
        assert tree_depth(n, d) == 1 + max(len(s) for s in tree_sources([f"r.{i}" for i in range(n)], d).values())
    chain = tree_sources([f"r.{i}" for i in range(20)], 1)  # a chain: every replica's parent is the one before
    assert chain["r.0"] == [] and chain["r.1"] == [relay_name("r.0")]
    assert chain["r.19"][:2] == [relay_name("r.18"), relay_name("r.17")] and len(chain["r.19"]) == MAX_SOURCES
    assert tree_depth(20, 1) == 20


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "text,message",
    [
        (
            '[workflow]\nweight_fanout = "tree"\nweight_transport = "collective"',
            "workflow.weight_fanout = 'tree': the relay tree forwards nng chunks; with weight_transport = 'collective' "
            'set weight_fanout = "direct"',
        ),
        ('[workflow]\nweight_fanout = "ring"', "workflow.weight_fanout: Invalid enum value 'ring'; use one of 'direct', 'tree'"),
        ("[workflow]\nweight_fanout_degree = 0", "workflow.weight_fanout_degree = 0: out of range; use a value between 1 and 64"),
    ],
)
def test_a_wrong_fanout_names_the_key_and_the_fix(text, message):
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    assert message in str(info.value)


@pytest.mark.timeout(10)
def test_the_default_fanout_is_direct_as_before():
    assert load_config_text("").workflow.weight_fanout == "direct"


def _chunk(version: int, index: int) -> messages.WeightChunk:
    return messages.WeightChunk(version=version, index=index, names=["w"], tensors=[Tensor(dtype="uint8", shape=(1,), data=b"x")])


@pytest.mark.timeout(10)
def test_a_relay_store_answers_held_requests_when_their_chunk_arrives_and_tells_the_rest_it_will_not_come():
    store = RelayStore(num_kept=2)
    store.announce(1)
    assert store.coming(1) and not store.coming(2)  # announced, not begun: it will fetch it
    store.wait(1, 0, "a")
    store.wait(1, 1, "b")
    assert store.begin(1, 2) == [] and store.coming(1)
    assert store.put(_chunk(1, 0)) == ["a"] and store.get(1, 0) is not None and store.get(1, 1) is None
    assert store.end(1) == ["b"] and not store.coming(1)  # its fetch ended without chunk 1
    assert store.begin(1, 2) == [] and store.coming(1)  # retried: coming again
    store.wait(1, 1, "c")
    store.begin(2, 2)
    assert store.begin(3, 2) == ["c"]  # v1 dropped (two kept): its waiters are answered
    assert store.get(1, 0) is None and not store.coming(1)
    store.wait(3, 0, "d")
    assert store.unwait(3, 0, "d") and not store.unwait(3, 0, "d") and store.num_waiting() == 0


@pytest.fixture
def cluster():
    transport = TransportConfig(scheme="ipc", ipc_dir=tempfile.mkdtemp(prefix="af-fanout-test-"))
    directory = start_directory(transport)
    yield transport, DirectoryClient(directory.address, transport)
    directory.stop()


def _versions(fleet: Fleet, versions, among=None) -> dict[int, dict]:
    out = {}
    for v in versions:
        named = version_tensors(v, VERSION_BYTES, TENSOR_BYTES)
        out[v] = {**fleet.publish(v, named, wait_s=60.0, among=among), "crc": tensors_crc32(named)}
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fanout", ["direct", "tree"])
def test_every_version_reaches_every_replica_byte_exact_in_order_and_the_tree_serves_degree_copies_from_the_trainer(
    cluster, tmp_path, fanout
):
    transport, client = cluster
    n, degree = 7, 2
    run_dir = fanout_run_dir(str(tmp_path), fanout, degree, timeout_s=20.0)
    fleet = Fleet(client, transport, run_dir, fanout, n, 2, CHUNK_BYTES, timeout_s=20.0, check_bytes=True)
    try:
        sent = _versions(fleet, (1, 2, 3))
        final = fleet.records()  # once every replica holds v3: every relay has served its children
    finally:
        fleet.close()
    for v, point in sent.items():
        assert [r.crc32[v] for r in point["records"]] == [point["crc"]] * n, f"v{v} not byte-exact everywhere"
        copies = degree if fanout == "tree" else n
        assert point["served_bytes"] == copies * VERSION_BYTES  # the trainer's side, counted
    last = sent[3]["records"]
    for r in last:
        assert not r.errors, r.errors  # every swap's digest check passed
        assert sorted(r.swapped_at_s) == [1, 2, 3]
        assert r.swapped_at_s[1] < r.swapped_at_s[2] < r.swapped_at_s[3]
    if fanout == "tree":
        assert sum(r.num_bytes_from_root for r in last) == 3 * degree * VERSION_BYTES
        assert sum(r.num_bytes_relayed for r in last) == 3 * (n - degree) * VERSION_BYTES
        assert sum(r.num_relay_bytes_served for r in final) == 3 * (n - degree) * VERSION_BYTES
        assert sum(r.num_fallbacks for r in final) == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fanout", ["direct", "tree"])
def test_with_an_emulated_link_each_sender_serves_at_its_rate_and_every_replica_still_gets_every_version(
    cluster, tmp_path, fanout
):
    transport, client = cluster
    n, degree, mb_s = 7, 2, 4.0
    run_dir = fanout_run_dir(str(tmp_path), fanout, degree, timeout_s=20.0, link_mb_s=mb_s)
    fleet = Fleet(client, transport, run_dir, fanout, n, 2, CHUNK_BYTES, timeout_s=20.0, check_bytes=True)
    try:
        sent = _versions(fleet, (1, 2))
        final = fleet.records()
    finally:
        fleet.close()
    copies = degree if fanout == "tree" else n
    for v, point in sent.items():
        assert [r.crc32[v] for r in point["records"]] == [point["crc"]] * n, f"v{v} not byte-exact everywhere"
        assert point["served_bytes"] == copies * VERSION_BYTES
        # the trainer's link sends its copies one after another: the last replica cannot have them sooner
        assert point["last_s"] >= copies * VERSION_BYTES / (mb_s * 1e6), point["last_s"]
    assert all(not r.errors for r in final), [r.errors for r in final]
    assert sum(r.num_fallbacks for r in final) == 0  # a paced relay is not taken for a frozen one


def _victim(client: DirectoryClient, transport: TransportConfig, name: str, timeout_s: float, stall: tuple[int, int] | None):
    cmd = [sys.executable, str(HERE / "_fanout_victim.py"), "--directory", client.address, "--ipc-dir", transport.ipc_dir]
    cmd += ["--name", name, "--timeout-s", str(timeout_s)]
    if stall is not None:
        cmd += ["--stall-version", str(stall[0]), "--stall-index", str(stall[1])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


VICTIMS = {
    # the victim: its children (they leave it mid-version), and the replicas that get v2 with no byte from the root
    "rollout.0": (["rollout.2", "rollout.3"], ["rollout.6", "rollout.7", "rollout.8"]),  # its children go to the root
    "rollout.2": (["rollout.6", "rollout.7"], ["rollout.6", "rollout.7"]),  # its children go to their grandparent
}


# the default suite keeps one kill and one freeze, one at each depth of the tree (rollout.0 killed:
# its children go to the root, and a restarted relay must hear of a version before its children ask
# it, which this case caught once; rollout.2 frozen: its children go to their grandparent); the other
# two (20-30 s each, mostly waiting out timeouts) run with -m slow
RELAY_CASES = [
    ("kill", "rollout.0"),
    ("freeze", "rollout.2"),
    pytest.param("kill", "rollout.2", marks=pytest.mark.slow),
    pytest.param("freeze", "rollout.0", marks=pytest.mark.slow),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault,victim_name", RELAY_CASES)
def test_a_relay_killed_or_frozen_mid_transfer_costs_its_subtree_no_version_and_no_hang(cluster, tmp_path, fault, victim_name):
    """In the tree of 2 over rollout.0-8, rollout.0 relays to 2 and 3, rollout.2 to 6 and 7, rollout.3 to 8.
    The victim's fetch of v2 stops before chunk 5 (its children have some of chunks 0-4 from it): it
    is killed (or frozen). Its children finish v2 from the next source up (the root, or their
    grandparent rollout.0), and their own children keep them as parents; v3 is published with it
    dead or frozen; then it is back (restarted in place, or thawed) and v4 goes through the whole
    tree again. Every survivor holds every version byte-exact, in order, its digest checked."""
    transport, client = cluster
    # above the weights actor's own stall while it announces to a frozen replica (two tells of 2 s); a
    # relay that does not answer is left after min(5 s, this) (weights/_relay.py SOURCE_TIMEOUT_S)
    timeout_s = 10.0
    names = [f"rollout.{i}" for i in range(9)]
    children, no_root = VICTIMS[victim_name]
    survivors = [n for n in names if n != victim_name]
    run_dir = fanout_run_dir(str(tmp_path), "tree", 2, timeout_s=timeout_s)
    victim = _victim(client, transport, victim_name, timeout_s, stall=(2, 5))
    fleet = None
    try:
        fleet = Fleet(
            client,
            transport,
            run_dir,
            "tree",
            len(names),
            1,
            CHUNK_BYTES,
            timeout_s=timeout_s,
            external=(victim_name,),
            check_bytes=True,
        )
        sent = _versions(fleet, (1,))
        before = {r.name: r for r in sent[1]["records"]}
        assert victim.stdout is not None
        fleet.weights.pykka_ref.ask(_publish_only(2))
        assert victim.stdout.readline().strip() == "STALLED"  # mid-transfer: chunks 0-4 in, 5-15 not
        if fault == "kill":
            victim.kill()
            victim.wait(10)
        else:
            victim.send_signal(signal.SIGSTOP)
        v2 = {n: client.ref(n).ask(messages.GetFanoutRecord(version=2), timeout_s=60) for n in survivors}
        sent.update(_versions(fleet, (3,), among=survivors))
        if fault == "kill":
            victim = _victim(client, transport, victim_name, timeout_s, stall=None)  # restarted in place: a new address
        else:
            victim.send_signal(signal.SIGCONT)
            assert victim.stdin is not None
            victim.stdin.write("go\n")
            victim.stdin.flush()
        sent.update(_versions(fleet, (4,)))
    finally:
        if fleet is not None:
            fleet.close()
        _stop(victim)
    crc2 = tensors_crc32(version_tensors(2, VERSION_BYTES, TENSOR_BYTES))
    for r in v2.values():
        assert r.crc32[2] == crc2, f"{r.name} lost v2 or got it wrong"
    last = {r.name: r for r in sent[4]["records"]}
    for name in survivors:
        r = last[name]
        assert not r.errors, r.errors  # every swap's digest check passed
        assert sorted(r.swapped_at_s) == [1, 2, 3, 4] and r.swapped_at_s[3] < r.swapped_at_s[4], name
        assert r.crc32[3] == sent[3]["crc"] and r.crc32[4] == sent[4]["crc"], name
    assert all(last[c].num_fallbacks > before[c].num_fallbacks for c in children)  # they left it mid-version
    # the rest came from the next live source up; a live parent falling back itself kept its children
    assert all(v2[n].num_bytes_from_root == before[n].num_bytes_from_root for n in no_root)
    untouched = [n for n in survivors if n not in children]
    assert all(v2[n].num_fallbacks == before[n].num_fallbacks for n in untouched)
    assert last[victim_name].crc32[4] == sent[4]["crc"]  # back, and in the tree again
    # v4 through the tree: the root served its two children, and at most a few chunks more. A thawed victim
    # answers late at first; a child that gives up on a chunk in that time takes it from the root (seen: one
    # chunk, every time, for a frozen child of the root; the exact figure was this test's flake)
    assert 2 * VERSION_BYTES <= sent[4]["served_bytes"] < 3 * VERSION_BYTES


def _publish_only(version: int):
    """Publish ``version`` without waiting for the replicas (the test drives what follows)."""
    from asyncflow.actors.weights.actor import Publish
    from asyncflow.engines.digest import weights_digest

    named = version_tensors(version, VERSION_BYTES, TENSOR_BYTES)
    return Publish(version, named, weights_digest(named))


@pytest.mark.timeout(300)
# with an emulated link (workflow.weight_link_mb_s: the twin's pacing) too, in -m slow (suite time)
@pytest.mark.parametrize("link_mb_s", [0.0, pytest.param(2000.0, marks=pytest.mark.slow)])
def test_a_real_size_embedding_relayed_down_a_chain_reaches_every_replica_byte_exact_with_its_digest(
    cluster, tmp_path, link_mb_s
):
    """The Qwen2.5-0.5B embedding (151,936 x 896, past 2^24 elements), in bfloat16 as a
    bfloat16 replica holds it, through a chain of 3 (degree 1: every hop but the first is
    a relay): no hop's index or chunk arithmetic may round at that size."""
    import torch

    transport, client = cluster
    shape = (151_936, 896)  # Qwen2.5-0.5B's vocabulary x hidden (tests/engines/real_sizes.py)
    embed = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float32).to(torch.bfloat16)
    embed.view(-1)[-1] = 7.0  # the last element is the one float32 positions lost
    named = [("model.embed_tokens.weight", embed), ("model.norm.weight", torch.ones(shape[1]))]
    assert embed.numel() > 2**24
    run_dir = fanout_run_dir(str(tmp_path), "tree", 1, timeout_s=60.0, link_mb_s=link_mb_s)
    fleet = Fleet(client, transport, run_dir, "tree", 3, 2, 32 << 20, timeout_s=60.0, check_bytes=True)
    try:
        point = fleet.publish(1, named, wait_s=240.0)
    finally:
        fleet.close()
    num_bytes = sum(t.numel() * t.element_size() for _, t in named)
    assert [r.crc32[1] for r in point["records"]] == [tensors_crc32(named)] * 3
    assert all(not r.errors for r in point["records"])  # each replica's digest check passed
    assert point["served_bytes"] == num_bytes  # one copy from the trainer's side, the rest relayed
    assert sum(r.num_bytes_relayed for r in point["records"]) == 2 * num_bytes
    if link_mb_s:  # the trainer's link sent its copy at the link's rate: the last replica cannot be sooner
        assert point["last_s"] >= num_bytes / (link_mb_s * 1e6)


@pytest.mark.timeout(10)
def test_tree_levels_put_every_replicas_parent_in_the_level_before_its_own():
    """The weights actor announces a version a level at a time (weights/actor.py): a parent hears
    before its children ask it, as when the replicas were told in turn."""
    names = [f"rollout.{i}" for i in range(8)]
    assert tree_levels(names, 2) == [
        ["rollout.0", "rollout.1"],
        [f"rollout.{i}" for i in range(2, 6)],
        ["rollout.6", "rollout.7"],
    ]
    for n, d in ((128, 2), (100, 3), (20, 1), (1, 4)):
        replicas = [f"r.{i}" for i in range(n)]
        levels, sources = tree_levels(replicas, d), tree_sources(replicas, d)
        assert sorted(r for level in levels for r in level) == sorted(replicas) and len(levels) == tree_depth(n, d)
        depth = {r: k for k, level in enumerate(levels) for r in level}
        for r in replicas:
            assert depth[r] == 0 if not sources[r] else depth[sources[r][0].removeprefix("relay.")] == depth[r] - 1
