"""The planner actor's decision path with real messages: fake roles answer GetRoleStats
with scripted busy/wait times, StepMetrics arrive over nng, a move is handed to the
driver, MoveApplied comes back, and the measured gain is logged. The last test runs
a tiny config end to end with ``[planner] online = true``."""

from __future__ import annotations

import json
import queue

import pytest

from asyncflow.actors.driver.planner_actor import PlannerActor
from asyncflow.actors.runtime import messages
from asyncflow.config.planner import PlannerConfig
from asyncflow.core import protocol
from asyncflow.core.actor import Actor, serve_actor
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.transport import TransportConfig
from asyncflow.planner.online import Split


class FakeRole(Actor):
    """Answers GetRoleStats from a shared table the test advances step by step."""

    Inbox = messages.LoopIn

    def __init__(self, ctx, table: dict, threads: list):
        super().__init__(ctx)
        self.table = table
        self.threads = threads

    def handle(self, msg, pending):
        match msg:
            case messages.GetRoleStats():
                busy, wait = self.table[self.ctx.name]
                return messages.RoleStats(role=self.ctx.name, busy_s=busy, wait_s={"data": wait})
            case messages.SetThreads(num_threads=n):
                self.threads.append(n)
                return protocol.Ok()
            case _:
                return protocol.Ok()


class Bench:
    """A directory, fake roles and the planner, in this process over inproc sockets."""

    def __init__(
        self, tmp_path, config: PlannerConfig, replicas: list[str], train_threads: int, num_steps: int = 30, cores: int = 0
    ):
        self.transport = TransportConfig(scheme="inproc")
        self.directory = start_directory(self.transport)
        self.dc = DirectoryClient(self.directory.address, self.transport)
        self.table: dict[str, tuple[float, float]] = {}
        self.threads: list[int] = []
        self.actors = []
        for name in [*replicas, "trainer"]:
            self.add_role(name)
        self.moves: queue.Queue = queue.Queue()
        self.path = tmp_path / "planner.jsonl"
        self.depth = 0.0  # the training queue's depth the planner reads (no queue here)
        self.planner = serve_actor(
            PlannerActor,
            "planner",
            self.transport,
            directory_address=self.directory.address,
            run_dir=str(tmp_path),
            config=config,
            rollout_replicas=replicas,
            train_threads=train_threads,
            apply=self.moves.put,
            num_steps=num_steps,
            cores=cores,
            queue_depth=self.queue_depth,
        )
        self.dc.register(self.planner.entry())
        self.ref = self.dc.ref("planner")
        self.time_s = 0.0

    def add_role(self, name: str) -> None:
        self.table[name] = (0.0, 0.0)
        actor = serve_actor(FakeRole, name, self.transport, table=self.table, threads=self.threads)
        self.dc.register(actor.entry())
        self.actors.append(actor)

    def queue_depth(self) -> float:
        return self.depth

    def step(self, step: int, step_s: float, busy: dict[str, float]) -> None:
        """Advance every role by one step of ``step_s`` at the given busy fractions, then
        tell the planner; the Ping after it returns once the step has been handled."""
        self.time_s += step_s
        for name, frac in busy.items():
            b, w = self.table[name]
            self.table[name] = (b + frac * step_s, w + (1 - frac) * step_s)
        self.ref.tell(messages.StepMetrics(step=step, values={"time_s": self.time_s}))
        self.ref.ask(protocol.Ping(), timeout_s=30)

    def events(self, kind: str) -> list[dict]:
        return [e for e in map(json.loads, self.path.read_text().splitlines()) if e["event"] == kind]

    def close(self) -> None:
        self.planner.stop()
        for actor in self.actors:
            actor.stop()
        self.directory.stop()


@pytest.fixture
def make_bench(tmp_path):
    made = []

    def make(**kwargs):
        made.append(Bench(tmp_path, **kwargs))
        return made[-1]

    yield make
    for bench in made:
        bench.close()


@pytest.mark.timeout(60)
def test_each_observed_step_carries_the_training_queue_depth_read_at_its_boundary(make_bench):
    b = make_bench(config=PlannerConfig(online=True, patience_steps=2, measure_steps=2), replicas=["rollout.0"], train_threads=2)
    balanced = {"rollout.0": 0.8, "trainer": 0.8}
    b.step(0, 10.0, balanced)  # starts the clock: not observed
    for step, depth in ((1, 12.0), (2, 0.0)):
        b.depth = depth
        b.step(step, 10.0, balanced)
    assert [(e["step"], e["train_queue_rows"]) for e in b.events("observe")] == [(1, 12.0), (2, 0.0)]


@pytest.mark.timeout(60)
def test_a_trainer_waiting_on_rollout_gets_a_replica_and_the_gain_is_measured_after(make_bench):
    cfg = PlannerConfig(online=True, patience_steps=2, measure_steps=2)
    b = make_bench(config=cfg, replicas=["rollout.0"], train_threads=2)
    b.ref.ask(protocol.Ping(), timeout_s=30)
    assert b.threads == [2]  # the trainer was given its threads at start
    slow = {"rollout.0": 1.0, "trainer": 0.2}
    for step in range(3):  # step 0 only starts the clock
        b.step(step, 10.0, slow)
    move = b.moves.get(timeout=10)
    assert (move.from_role, move.to_role, move.num_workers) == ("train", "rollout", 1)
    # work per step: rollout 1.0 x 1 x 10 = 10 worker-s, train 0.2 x 2 x 10 = 4: max(10/2, 4/1) = 5 s
    assert move.predicted_step_s_after == pytest.approx(5.0)
    [decision] = b.events("decision")
    assert decision["step"] == 2 and decision["predicted_gain"] == pytest.approx(1.0)
    assert decision["split_after"] == {"rollout_workers": 2, "train_workers": 1}

    b.step(3, 10.0, slow)  # the move is still in flight: no second decision
    assert b.moves.empty()
    b.add_role("rollout.1")
    b.ref.tell(messages.MoveApplied(ok=True, rollout_replicas=["rollout.0", "rollout.1"], train_threads=1))
    fast = {"rollout.0": 1.0, "rollout.1": 1.0, "trainer": 0.8}
    for step in range(4, 7):  # step 4 straddles the move and is not counted
        b.step(step, 6.0, fast)
    [measured] = b.events("measured")
    assert measured["measured_gain"] == pytest.approx(10.0 / 6.0 - 1, abs=1e-3)
    assert measured["predicted_gain"] == pytest.approx(1.0)
    assert b.moves.empty()


@pytest.mark.timeout(60)
def test_on_shared_cores_an_idle_trainer_gets_a_replica_beside_it_and_keeps_its_threads(make_bench):
    cfg = PlannerConfig(online=True, patience_steps=2, max_rollout_replicas=3)
    b = make_bench(config=cfg, replicas=["rollout.0"], train_threads=1, cores=2)
    for step in range(3):
        b.step(step, 10.0, {"rollout.0": 1.0, "trainer": 0.23})
    move = b.moves.get(timeout=10)
    assert move.split_after == Split(rollout_workers=2, train_workers=1)
    # CPU s per step: rollout 10, train 2.3; 2 cores: max(10/2, 2.3/1, 12.3/2) = 6.15 s
    assert move.predicted_step_s_after == pytest.approx(6.15)
    assert "cores shared" in move.reason
    b.add_role("rollout.1")
    b.ref.tell(messages.MoveApplied(ok=True, rollout_replicas=["rollout.0", "rollout.1"], train_threads=1))
    for step in range(3, 8):  # both cores busy now: a third replica would not pay
        b.step(step, 6.5, {"rollout.0": 1.0, "rollout.1": 1.0, "trainer": 0.35})
    assert b.moves.empty()


@pytest.mark.timeout(60)
def test_balanced_roles_or_a_short_imbalance_move_nothing(make_bench):
    b = make_bench(config=PlannerConfig(online=True, patience_steps=3), replicas=["rollout.0"], train_threads=1)
    b.step(0, 5.0, {"rollout.0": 0.9, "trainer": 0.9})
    for step in range(1, 6):
        b.step(step, 5.0, {"rollout.0": 0.9, "trainer": 0.85})
    b.step(6, 5.0, {"rollout.0": 1.0, "trainer": 0.1})  # one leaning step is not enough
    b.step(7, 5.0, {"rollout.0": 0.9, "trainer": 0.9})
    assert b.moves.empty() and not b.events("decision")
    assert len(b.events("observe")) == 7


@pytest.mark.timeout(60)
def test_a_move_beyond_max_rollout_replicas_is_held_and_logged_once(make_bench):
    cfg = PlannerConfig(online=True, patience_steps=2, max_rollout_replicas=1)
    b = make_bench(config=cfg, replicas=["rollout.0"], train_threads=2)
    for step in range(6):
        b.step(step, 10.0, {"rollout.0": 1.0, "trainer": 0.2})
    assert b.moves.empty()
    [held] = b.events("held")
    assert "planner.max_rollout_replicas = 1" in held["reason"]


@pytest.mark.timeout(60)
def test_a_failed_move_keeps_the_split_and_lets_the_planner_decide_again(make_bench):
    cfg = PlannerConfig(online=True, patience_steps=1)
    b = make_bench(config=cfg, replicas=["rollout.0"], train_threads=2)
    b.step(0, 10.0, {"rollout.0": 1.0, "trainer": 0.2})
    b.step(1, 10.0, {"rollout.0": 1.0, "trainer": 0.2})
    b.moves.get(timeout=10)
    b.ref.tell(messages.MoveApplied(ok=False, rollout_replicas=["rollout.0"], train_threads=2, error="no process"))
    b.step(2, 10.0, {"rollout.0": 1.0, "trainer": 0.2})
    again = b.moves.get(timeout=10)
    assert again.split_after.rollout_workers == 2
    assert [e["ok"] for e in b.events("applied")] == [False]


@pytest.mark.timeout(60)
def test_a_move_that_cannot_repay_its_cost_in_the_steps_left_is_held_and_says_so(make_bench):
    # 5 s saved a step from step 2 on, of 12: the move (60 s, 6 steps) would be in place for 3 steps
    cfg = PlannerConfig(online=True, patience_steps=2, move_cost_s=60.0)
    b = make_bench(config=cfg, replicas=["rollout.0"], train_threads=2, num_steps=12)
    for step in range(3):
        b.step(step, 10.0, {"rollout.0": 1.0, "trainer": 0.2})
    assert b.moves.empty()
    [held] = b.events("held")
    assert "planner.move_cost_s = 60" in held["reason"] and "9 steps left" in held["reason"]
    for step, step_s in ((3, 11.0), (4, 9.5)):  # held again, at other figures: not logged again
        b.step(step, step_s, {"rollout.0": 1.0, "trainer": 0.2})
    assert len(b.events("held")) == 1 and b.moves.empty()


@pytest.mark.timeout(60)
def test_a_move_that_slowed_the_run_is_reverted_its_cost_measured_and_not_tried_again(make_bench):
    cfg = PlannerConfig(online=True, patience_steps=2, measure_steps=2, move_cost_s=5.0)
    b = make_bench(config=cfg, replicas=["rollout.0"], train_threads=2, num_steps=40)
    slow = {"rollout.0": 1.0, "trainer": 0.2}
    for step in range(3):
        b.step(step, 10.0, slow)
    b.moves.get(timeout=10)
    b.step(3, 17.0, slow)  # the spawn takes a core: 7 s extra while the move is carried out
    b.add_role("rollout.1")
    b.ref.tell(messages.MoveApplied(ok=True, rollout_replicas=["rollout.0", "rollout.1"], train_threads=1))
    worse = {"rollout.0": 1.0, "rollout.1": 1.0, "trainer": 0.3}
    for step in range(4, 7):  # step 4 straddles the move; 5 and 6 are measured: slower than before
        b.step(step, 12.0 if step > 4 else 11.0, worse)
    [measured] = b.events("measured")
    assert measured["measured_gain"] < 0
    assert measured["cost_s"] == pytest.approx(8.0)  # (17 - 10) + (11 - 10)
    back = b.moves.get(timeout=10)
    assert (back.from_role, back.to_role) == ("rollout", "train")
    assert back.split_after == Split(rollout_workers=1, train_workers=2)
    [reverted] = b.events("revert")
    assert reverted["step"] == 6
    b.ref.tell(messages.MoveApplied(ok=True, rollout_replicas=["rollout.0"], train_threads=2))
    for step in range(7, 13):  # leaning the same way again: the direction that did not pay is not tried again
        b.step(step, 10.0, slow)
    assert b.moves.empty()
    held = b.events("held")
    assert len(held) == 1 and "did not pay" in held[0]["reason"]


@pytest.mark.timeout(60)
def test_a_move_that_paid_keeps_and_its_measured_cost_replaces_the_prior(make_bench):
    cfg = PlannerConfig(online=True, patience_steps=2, measure_steps=2, move_cost_s=30.0, max_rollout_replicas=3)
    b = make_bench(config=cfg, replicas=["rollout.0"], train_threads=3, num_steps=60)
    for step in range(3):
        b.step(step, 10.0, {"rollout.0": 1.0, "trainer": 0.2})
    b.moves.get(timeout=10)
    b.add_role("rollout.1")
    b.ref.tell(messages.MoveApplied(ok=True, rollout_replicas=["rollout.0", "rollout.1"], train_threads=2))
    b.step(3, 12.0, {"rollout.0": 1.0, "trainer": 0.2})  # straddles: 2 s extra
    for step in range(4, 6):
        b.step(step, 6.0, {"rollout.0": 1.0, "rollout.1": 1.0, "trainer": 0.3})
    [measured] = b.events("measured")
    assert measured["measured_gain"] > 0 and measured["cost_s"] == pytest.approx(2.0)
    assert not b.events("revert")
    decision = b.moves.get(timeout=10)
    assert decision.split_after.rollout_workers == 3  # the next move is weighed at the measured 2 s, not 30
    assert "measured" in b.events("decision")[-1]["cost"]


@pytest.mark.slow  # ~75 s on the shared 2 cores: the start-up plus spawning a replica mid-run (run with -m slow)
@pytest.mark.timeout(240)
def test_moves_during_a_tiny_run_add_and_remove_a_replica_and_every_step_still_trains_once(tmp_path):
    from asyncflow.actors.driver.launcher import Launcher
    from asyncflow.actors.driver.prepare import prepare_new
    from asyncflow.config.load import load_config_text
    from asyncflow.planner.online import MoveDecision, Split

    cfg = load_config_text("""
        [model]
        tiny_warm_start = false
        [data]
        num_prompts = 50
        [algorithm]
        group_size = 2
        [rollout]
        prompts_per_call = 1
        [rollout.sampling]
        max_new_tokens = 16
        [train]
        num_steps = 6
        prompts_per_step = 2
        [logging]
        progress = false
        [planner]
        online = true
        patience_steps = 100
        train_threads = 2
    """)
    cfg, rd, launch = prepare_new(cfg, tmp_path / "run")
    launcher = Launcher(cfg, rd, launch)
    launcher.plan()

    def move(to_role: str, split: Split) -> MoveDecision:
        return MoveDecision(
            from_role="train" if to_role == "rollout" else "rollout",
            to_role=to_role,
            num_workers=1,
            split_after=split,
            predicted_step_s_before=1.0,
            predicted_step_s_after=0.5,
            predicted_gain=1.0,
            reason="test",
        )

    try:
        launcher.start()
        # queued as the planner queues them; the driver's loop carries them out between steps
        launcher.scaler.moves.put(move("rollout", Split(rollout_workers=2, train_workers=1)))
        launcher.scaler.moves.put(move("train", Split(rollout_workers=1, train_workers=2)))
        finished = launcher.wait()
        hosts = set(launcher.supervisor.names())
    finally:
        launcher.stop()
    assert finished.last_step == 5
    applied = [e for e in map(json.loads, (rd / "planner.jsonl").read_text().splitlines()) if e["event"] == "applied"]
    assert [(e["ok"], e["split"]["rollout_replicas"], e["split"]["train_threads"]) for e in applied] == [
        (True, ["rollout.0", "rollout.1"], 1),
        (True, ["rollout.0"], 2),
    ]
    assert "rollout.1" not in hosts and "rollout.0" in hosts
    trained = [json.loads(line) for line in (rd / "trained.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trained] == list(range(6))
    rows = [i for t in trained for i in t["indices"]]
    assert len(rows) == len(set(rows)) == 6 * 4


def test_shared_cores_bound_counts_each_sides_parallelism_and_the_cores_together():
    from asyncflow.planner.shared_cores import bound_s

    assert bound_s(10.0, 2.3, 1, 1, 2) == 10.0  # one replica: rollout-bound
    assert bound_s(10.0, 2.3, 2, 1, 2) == pytest.approx(6.15)  # two: the cores are the limit
    assert bound_s(10.0, 2.3, 3, 1, 2) == pytest.approx(6.15)  # a third adds nothing
