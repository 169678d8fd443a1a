"""The rollout replica's weight versions in isolation (actors/rollout/inbox.py): a real
tiny native engine, and a receiver whose fetches the test releases one by one, so
each interleaving that matters is forced with events, not read off a clock."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch

from asyncflow.actors.rollout.inbox import WeightInbox
from asyncflow.actors.runtime import messages
from asyncflow.actors.weights import WeightReceiver
from asyncflow.core import protocol
from asyncflow.core.errors import ActorTimeout
from asyncflow.engines.config import RolloutEngineConfig
from asyncflow.engines.factory import build_rollout_engine

pytestmark = pytest.mark.timeout(60)


class HeldReceiver(WeightReceiver):
    """A ``WeightReceiver`` whose every fetch waits until the test releases it; it
    returns the announced version's tensors (each version's weights: the base ones
    plus the version number), or raises if the test says so."""

    def __init__(self, base: list[tuple[str, torch.Tensor]]):
        self.base = base
        self.calls: list[int] = []
        self.started = threading.Semaphore(0)  # one release per fetch started
        self.release: list[threading.Event] = []
        self.fail_next = False
        self.running = 0
        self.max_running = 0
        self._lock = threading.Lock()

    def weights_of(self, version: int) -> list[tuple[str, torch.Tensor]]:
        return [(name, t + 0.01 * version) for name, t in self.base]

    def fetch(self, weights, on_chunk=None, announced=None):
        assert announced is not None, "the inbox passes the announcement it fetches"
        go = threading.Event()
        with self._lock:
            self.calls.append(announced.version)
            self.release.append(go)
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        self.started.release()
        go.wait(30)
        with self._lock:
            self.running -= 1
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("the trainer's weights actor is gone")
        return announced.version, self.weights_of(announced.version)

    def close(self) -> None:
        for go in self.release:
            go.set()


class GrantRecorder:
    """The ``weights`` actor's side of the swap grant: records each ask."""

    def __init__(self, log: list[str]):
        self.log = log

    def ask(self, msg, timeout_s=None):
        self.log.append(f"{type(msg).__name__} v{msg.version}")
        return protocol.Ok()


@pytest.fixture
def setup(tiny_dir):
    engine = build_rollout_engine(RolloutEngineConfig(max_batch_size=4, kv_cache_bytes=1 << 20), tiny_dir)
    base = [(name, p.detach().clone()) for name, p in engine.model.named_parameters()]
    receiver = HeldReceiver(base)
    log: list[str] = []
    loads: list[int] = []
    load = engine.load_weights

    def recorded_load(tensors, version):
        log.append(f"load v{version}")
        loads.append(version)
        load(tensors, version)

    engine.load_weights = recorded_load

    def make(staleness: int = 0, timeout_s: float = 20.0) -> WeightInbox:
        return WeightInbox(
            "rollout.0",
            engine,
            threading.Lock(),
            receiver,
            lambda: GrantRecorder(log),
            staleness=staleness,
            verify=True,
            dtype=torch.float32,
            timeout_s=timeout_s,
            activity=lambda name: contextlib.nullcontext(),
        )

    yield make, engine, receiver, log, loads
    receiver.close()


def ready(version: int, replicas: int = 1, digest: int = 0) -> messages.WeightsReady:
    return messages.WeightsReady(version=version, num_chunks=1, num_bytes=1, digest=digest, replicas=replicas)


def test_rows_of_an_announced_version_are_asked_for_while_it_travels_and_generated_only_after_its_swap(setup):
    make, engine, receiver, _, loads = setup
    inbox = make()
    inbox.announce(ready(1))
    assert receiver.started.acquire(timeout=10)  # the fetch runs ...
    assert inbox.target() == 1  # ... and the unit already asks the queue for v1's rows (their steps <= 1 + k)
    swapped = threading.Event()
    worker = threading.Thread(target=lambda: (inbox.swap_to(1), swapped.set()), daemon=True)
    worker.start()
    # while the weights travel, nothing is generated with v1 rows: swap_to cannot return before its fetch does
    assert not swapped.wait(0.3) and engine.version == 0 and loads == []
    receiver.release[0].set()
    assert swapped.wait(10)
    worker.join(10)
    assert engine.version == 1 and loads == [1]
    assert inbox.digest == engine.weights_digest() != 0  # the held weights' digest, read back after the swap
    held = dict(engine.model.named_parameters())
    assert all(torch.equal(held[name], t) for name, t in receiver.weights_of(1))


def test_an_announcement_during_a_fetch_is_fetched_next_by_the_same_thread(setup):
    make, engine, receiver, _, loads = setup
    inbox = make()
    inbox.announce(ready(1))
    assert receiver.started.acquire(timeout=10)
    inbox.announce(ready(2))  # while v1 travels
    assert inbox.wanted == 2 and inbox.target() == 2
    receiver.release[0].set()
    assert receiver.started.acquire(timeout=10)  # the same fetch thread goes on to v2
    assert receiver.calls == [1, 2] and receiver.max_running == 1
    assert inbox.wait_fetched(10)  # v1 staged (v2 still travelling)
    receiver.release[1].set()
    inbox.swap_to(2)
    assert engine.version == 2 and loads[-1] == 2 and loads == sorted(loads)  # versions only grow
    assert inbox.digest == engine.weights_digest()


def test_versions_announced_back_to_back_during_a_fetch_collapse_to_the_newest(setup):
    make, engine, receiver, _, loads = setup
    inbox = make()
    inbox.announce(ready(1))
    assert receiver.started.acquire(timeout=10)  # v1 travels ...
    inbox.announce(ready(2))
    inbox.announce(ready(3))  # ... while v2 and v3 are announced back to back
    receiver.release[0].set()
    assert receiver.started.acquire(timeout=10)
    assert receiver.calls == [1, 3]  # v2 is never fetched: the next fetch is of the newest
    receiver.release[1].set()
    inbox.swap_to(3)
    assert engine.version == 3 and 2 not in loads


def test_an_old_announcement_is_ignored(setup):
    make, engine, receiver, _, _ = setup
    inbox = make()
    inbox.announce(ready(0))  # the engine holds v0 already
    assert inbox.wanted == -1 and receiver.calls == [] and inbox.target() == 0


def test_a_swap_takes_the_grant_when_other_replicas_generate_and_releases_it_after_loading(setup):
    make, engine, receiver, log, _ = setup
    inbox = make(staleness=1)
    inbox.announce(ready(1, replicas=2))
    assert receiver.started.acquire(timeout=10)
    receiver.release[0].set()
    inbox.swap_to(1)
    assert log == ["AcquireSwap v1", "load v1", "ReleaseSwap v1"]
    # alone (replicas=1), or in sync (k=0), no grant is asked for
    inbox.announce(ready(2, replicas=1))
    assert receiver.started.acquire(timeout=10)
    receiver.release[1].set()
    inbox.swap_to(2)
    assert log[3:] == ["load v2"]


def test_a_failed_fetch_is_started_again_by_swap_to(setup):
    make, engine, receiver, _, _ = setup
    inbox = make()
    receiver.fail_next = True
    inbox.announce(ready(1))
    assert receiver.started.acquire(timeout=10)
    receiver.release[0].set()  # this one fails: the fetch thread ends
    worker = threading.Thread(target=inbox.swap_to, args=(1,), daemon=True)
    worker.start()
    assert receiver.started.acquire(timeout=10)  # swap_to wants v1 again: a new fetch
    receiver.release[1].set()
    worker.join(10)
    assert engine.version == 1 and receiver.calls == [1, 1]


def test_weights_that_never_arrive_fail_the_unit_naming_the_version_and_the_key(setup):
    make, engine, receiver, _, _ = setup
    inbox = make(timeout_s=0.5)
    inbox.announce(ready(3))
    assert receiver.started.acquire(timeout=10)  # never released: the trainer is gone
    with pytest.raises(RuntimeError, match=r"weights v3 were announced but not fetched within workflow.weight_timeout_s"):
        inbox.swap_to(3)
    assert engine.version == 0


def test_an_engine_holding_other_weights_than_the_published_digest_fails_the_swap(setup):
    make, engine, receiver, _, _ = setup
    inbox = make()
    inbox.announce(ready(1, digest=0x1234))  # the trainer published another digest than what arrives
    assert receiver.started.acquire(timeout=10)
    receiver.release[0].set()
    with pytest.raises(RuntimeError, match=r"after loading weights v1 the engine holds weights with digest .* not the 1234"):
        inbox.swap_to(1)


class _Engine:
    """An engine as the inbox sees it (no model): its version, what it was last loaded with."""

    def __init__(self, version: int):
        self.version = version

    def weights_digest(self):
        return None

    def load_weights(self, tensors, version):
        self.version = version


class _Latest:
    """The weights actor's GetLatestWeights: it times out ``busy`` times (the actor busy
    past the ask's timeout), then answers ``version``."""

    def __init__(self, version: int, busy: int = 0, missing: bool = False):
        self.version, self.busy, self.missing, self.asked = version, busy, missing, 0

    def __call__(self) -> messages.WeightsReady:
        self.asked += 1
        if self.missing:
            raise LookupError("no actor named 'weights' registered within 0.2 s")
        if self.asked <= self.busy:
            raise ActorTimeout("weights", "ipc:///w.sock", "GetLatestWeights", 10)
        return ready(self.version)


class _Fetch(WeightReceiver):
    def fetch(self, weights, on_chunk=None, announced=None):
        return 9, []

    def close(self) -> None:
        pass


def _bare_inbox(version: int) -> WeightInbox:
    return WeightInbox(
        "rollout.3",
        _Engine(version),
        threading.Lock(),
        _Fetch(),
        lambda: None,
        staleness=1,
        verify=False,
        dtype=torch.float32,
        timeout_s=5.0,
        activity=lambda name: contextlib.nullcontext(),
    )


def test_a_restarted_replica_whose_weights_actor_is_busy_asks_again_in_the_background_instead_of_dying(caplog):
    """Found by tests/chaos/test_chaos_scale.py: the 32 restarted replicas of a killed pack asked
    the weights actor for the newest version as they started, it did not answer within 10 s (busy
    announcing to dead replicas), and each replica died in its start with the ActorTimeout."""
    inbox = _bare_inbox(2)
    latest, woken = _Latest(9, busy=2), threading.Event()
    inbox.catch_up(latest, retry_s=0.05, on_news=woken.set)  # returns at once: the replica starts
    assert woken.wait(10) and inbox.wanted == 9 and inbox.target() == 9 and latest.asked == 3
    assert "did not say which version is newest" in caplog.text and "asking again" in caplog.text
    inbox.close()


def test_a_replica_started_before_the_trainer_has_nothing_newer_to_catch_up_with():
    inbox, latest = _bare_inbox(0), _Latest(5, missing=True)
    inbox.catch_up(latest, retry_s=0.01)
    assert inbox.wanted == -1 and latest.asked == 1


def test_the_catch_up_stops_asking_once_an_announcement_brings_the_newest_version():
    inbox, latest = _bare_inbox(2), _Latest(9, busy=10**6)
    inbox.catch_up(latest, retry_s=0.05)
    inbox.announce(ready(4))
    asked = latest.asked
    threading.Event().wait(0.5)
    assert latest.asked <= asked + 1 and inbox.wanted == 4
    inbox.close()


class WatchedLock:
    """The engine lock, calling ``on_release`` just before each release: what a generate
    that takes the lock next sees."""

    def __init__(self):
        self._lock = threading.Lock()
        self.on_release = lambda: None

    def __enter__(self):
        self._lock.acquire()
        return self

    def __exit__(self, *exc):
        self.on_release()
        self._lock.release()


def test_a_swap_moves_the_engines_version_and_the_digest_a_generate_stamps_together(setup):
    _, engine, receiver, log, _ = setup
    lock = WatchedLock()
    inbox = WeightInbox(
        "rollout.0",
        engine,
        lock,
        receiver,
        lambda: GrantRecorder(log),
        staleness=0,
        verify=True,
        dtype=torch.float32,
        timeout_s=20.0,
        activity=lambda name: contextlib.nullcontext(),
    )
    seen: list[tuple[int, int, int]] = []
    lock.on_release = lambda: seen.append((engine.version, inbox.digest, engine.weights_digest()))
    inbox.announce(ready(1))
    assert receiver.started.acquire(timeout=10)
    receiver.release[0].set()
    inbox.swap_to(1)
    # when the swap lets go of the lock, a generate (the gateway's) reads version 1 and must read v1's digest with it
    version, digest, held = seen[-1]
    assert version == 1 and digest == held, (version, hex(digest), hex(held))


def test_each_staged_fetch_is_reported_with_its_start_and_duration_before_anyone_is_woken(setup):
    make, engine, receiver, _, _ = setup
    inbox = make()
    reported: list[tuple[float, float, int]] = []
    inbox.on_fetched = lambda start, seconds: reported.append((start, seconds, inbox.wanted))
    inbox.announce(ready(1))
    assert receiver.started.acquire(timeout=10)
    assert reported == []  # not while the weights travel
    receiver.release[0].set()
    assert inbox.wait_fetched(10)
    assert len(reported) == 1 and reported[0][1] >= 0 and reported[0][2] == 1  # reported by the time it is staged
    inbox.swap_to(1)
    assert engine.version == 1 and len(reported) == 1  # a swap is not a fetch
