"""PlannerActor: moves workers between rollout and training while a run goes on.

Runs in the driver, registered as ``planner``, when ``[planner] online = true``.
At each step boundary (every StepMetrics, passed on by the collector) it measures
the step just finished: its time (the trainer's clock), each side's busy fraction
(busy / (busy + waiting) since the previous boundary, from GetRoleStats; rollout is
the mean of its replicas) and the depth of the training queue (rows generated and
not yet taken by the trainer). It gives the window to ``planner.online.decide``; a
move it returns is logged with its predicted gain and handed to the driver
(``apply``), which carries it out between steps and answers MoveApplied. After
``measure_steps`` more steps the measured gain (mean step of the window that
motivated the move / mean step after it) is logged beside the prediction, with the
move's measured cost (the extra time of the steps it straddled).

A move is made only when it pays (`planner.move_cost`): the time it saves over the
steps left once it is in place must exceed its cost (the prior
``planner.move_cost_s`` until a move of that direction has been measured). A move
whose measured gain is negative is reverted at once, and its direction is held for
the rest of the run.

Workers: rollout has one per replica process, training one per torch thread of
the trainer. With devices (``cores = 0``) a move to rollout starts one more replica
and takes a thread from the trainer, and the reverse (`planner.online`). On a CPU
box (``cores`` > 0: processes share the cores) a move adds or removes one replica
and leaves the trainer's threads alone (`planner.shared_cores`).

Takes: StepMetrics (tell, from the collector), MoveApplied (tell, from the driver),
Ping, Stop.
Sends: SetThreads (ask, to the trainer, at start: ``planner.train_threads``),
GetRoleStats (ask, rollout replicas and trainer), GetTaskStatus (ask, queue controllers).
Writes: RUN_DIR/planner.jsonl, one object per event: ``observe``, ``decision``,
``held`` (a move the limits forbid, or one that would not repay its cost), ``applied``,
``measured``, ``revert`` (a move that slowed the run, handed back), ``skipped`` (a role
did not answer: the window starts again).

Invariants:
- at most one move is in flight: no decision while one waits to be applied;
- a decision uses only steps observed under the current split: the window starts
  again after every move, and the step during which a move was carried out is not
  counted (neither for decisions nor for the measured gain);
- a revert is never itself reverted, and a direction that did not pay is not tried again;
- a move keeps the total number of workers; rollout stays within 1 ..
  ``max_rollout_replicas`` replicas and the trainer keeps at least one thread.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import click
import msgspec

from asyncflow.actors.runtime import messages
from asyncflow.config import names
from asyncflow.config.planner import PlannerConfig
from asyncflow.core import protocol
from asyncflow.core.actor import Actor
from asyncflow.core.errors import AsyncflowError
from asyncflow.planner import move_cost, online, shared_cores

if TYPE_CHECKING:
    from asyncflow.core.tq.client import TQClient


class PlannerActor(Actor):
    Inbox = messages.PlannerIn

    def __init__(
        self,
        ctx,
        run_dir: str,
        config: PlannerConfig,
        rollout_replicas: list[str],
        train_threads: int,
        apply: Callable[[online.MoveDecision], None],
        num_steps: int,
        cores: int = 0,
        queue_depth: Callable[[], float] | None = None,
    ):
        """``apply(decision)`` hands a move to the driver (it must not block); the driver
        answers MoveApplied. ``cores`` > 0: roles share that many CPU cores (moves add or
        remove replicas, `planner.shared_cores`); 0: workers are devices (`planner.online`).
        ``queue_depth()``: the rows generated and not yet taken by the trainer, asked at
        each step boundary; None: read from the run's queue (``training_queue_depth``)."""
        super().__init__(ctx)
        self.config = config
        self.path = Path(run_dir) / "planner.jsonl"
        self.replicas = list(rollout_replicas)
        self.train_threads = train_threads
        self.apply = apply
        self.num_steps = num_steps
        self.cores = cores
        self.queue_depth = queue_depth or self.training_queue_depth
        self.policy = online.OnlinePolicy(
            imbalance_threshold=config.imbalance_threshold,
            patience_steps=config.patience_steps,
            min_gain=config.min_gain,
            max_move_workers=1,
            min_workers=1,
        )
        self.history: list[online.StepObservation] = []  # under the current split
        self.pending: online.MoveDecision | None = None  # handed to the driver, not yet applied
        self.measuring: dict | None = None  # the last applied move, until its gain is measured
        self.skip_next = False  # the step during which a move was applied
        self.decided_on: list[online.StepObservation] = []  # the window of the pending move
        self.during: list[online.StepObservation] = []  # steps from the pending move's decision to its first step after
        self.reverting = False  # the pending move is a revert
        self.costs = {  # per direction (the role that gains a worker): the prior, then the last measured
            "rollout": move_cost.MoveCost(cost_s=config.move_cost_s, wall_s=config.move_cost_s, measured=False),
            "train": move_cost.MoveCost(cost_s=0.0, wall_s=0.0, measured=False),
        }
        self.did_not_pay: dict[str, str] = {}  # direction -> why it is held for the rest of the run
        self.held_reason = ""
        self.decisions: list[dict] = []
        self._last_time_s: float | None = None
        self._prev: dict[str, tuple[float, float]] = {}  # role -> (busy_s, wait_s) at the last boundary
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="planner-stats")
        self._tq: TQClient | None = None  # made at the first training_queue_depth

    def on_start(self) -> None:
        self.ctx.ref(names.TRAINER).ask(messages.SetThreads(num_threads=self.train_threads), timeout_s=60)
        self._log(
            "start",
            split=self.split_dict(),
            policy=msgspec.to_builtins(self.policy),
            max_rollout_replicas=self.config.max_rollout_replicas,
            shared_cores=self.cores,
        )

    def on_stop(self) -> None:
        self._pool.shutdown(wait=False)
        if self._tq is not None:
            self._tq.close()

    @property
    def split(self) -> online.Split:
        return online.Split(rollout_workers=len(self.replicas), train_workers=self.train_threads)

    def split_dict(self) -> dict:
        return {"rollout_replicas": list(self.replicas), "train_threads": self.train_threads}

    # -- messages ------------------------------------------------------------------------
    def handle(self, msg, pending):
        match msg:
            case messages.StepMetrics(step=step, values=values):
                self.on_step(step, values)
                return protocol.Ok()
            case messages.MoveApplied():
                self.on_applied(msg)
                return protocol.Ok()
            case protocol.Stop():
                return protocol.Ok()

    def on_step(self, step: int, values: dict[str, float]) -> None:
        obs = self.observe(step, values)
        if obs is None:
            return
        if self.pending is not None:  # under the old split while the move is carried out: its cost
            self.during.append(obs)
            return
        if self.skip_next:  # straddles the move: neither before nor after (its cost)
            self.skip_next = False
            if self.measuring is not None:
                self.measuring["during"].append(obs)
            return
        self.history.append(obs)
        if self.measuring is not None:
            self._measure(obs)
        if self.pending is None and self.num_steps - 1 - step >= 2:
            self._decide(step)  # (not in the last steps: too late to pay off, and it would race the final checkpoint)

    def on_applied(self, msg: messages.MoveApplied) -> None:
        decision, self.pending = self.pending, None
        reverting, self.reverting = self.reverting, False
        during, self.during = self.during, []
        if not msg.ok:
            self._log("applied", ok=False, error=msg.error, split=self.split_dict())
            self.history = []
            return
        before = self.decided_on  # the steps that motivated the move, not those during it (a spawn slows them)
        split_before = self.split
        self.replicas = list(msg.rollout_replicas)
        self.train_threads = msg.train_threads
        self.history = []
        self.skip_next = True
        if decision is not None and before:  # (None: a move the planner did not ask for)
            self.measuring = {
                "decision": decision,
                "before": before,
                "during": during,
                "after": [],
                "split_before": split_before,
                "revert": reverting,
            }
        self._log("applied", ok=True, split=self.split_dict())

    # -- measuring -----------------------------------------------------------------------
    def observe(self, step: int, values: dict[str, float]) -> online.StepObservation | None:
        """The step that just ended, or None for the first one (it includes the start-up)."""
        time_s = values.get("time_s")
        if time_s is None:
            raise ValueError(f"StepMetrics of step {step} has no 'time_s'; the planner needs the trainer's clock")
        last, self._last_time_s = self._last_time_s, time_s
        roles = [*self.replicas, names.TRAINER]
        try:
            stats = dict(zip(roles, self._pool.map(self._stats, roles)))
        except (AsyncflowError, LookupError) as exc:  # a role restarting or gone: no figure for this step
            self._log("skipped", step=step, reason=str(exc))
            self._last_time_s, self._prev, self.history = None, {}, []
            return None
        fractions = {name: self._busy_fraction(name, s) for name, s in stats.items()}
        if last is None:
            return None
        rollout_busy = sum(fractions[n] for n in self.replicas) / len(self.replicas)
        obs = online.StepObservation(
            step=step,
            step_s=time_s - last,
            rollout=online.RoleWindow(busy_fraction=rollout_busy),
            train=online.RoleWindow(busy_fraction=fractions[names.TRAINER], queue_depth=self.queue_depth()),
        )
        self._log(
            "observe",
            step=step,
            step_s=round(obs.step_s, 4),
            rollout_busy=round(rollout_busy, 3),
            train_busy=round(obs.train.busy_fraction, 3),
            train_queue_rows=obs.train.queue_depth,
            busy={n: round(f, 3) for n, f in fractions.items()},
            quiet=True,
        )
        return obs

    def _stats(self, name: str) -> messages.RoleStats:
        # answered between the role's units: waits at most one unit (a generate call, a train step)
        return self.ctx.ref(name).ask(messages.GetRoleStats(), timeout_s=300)

    def _busy_fraction(self, name: str, s: messages.RoleStats) -> float:
        wait = sum(s.wait_s.values())
        busy0, wait0 = self._prev.get(name, (0.0, 0.0))
        self._prev[name] = (s.busy_s, wait)
        d_busy, d_wait = s.busy_s - busy0, wait - wait0
        if d_busy + d_wait <= 0:  # no unit ended since the last boundary
            return 0.0 if s.state.startswith("wait_") else 1.0
        return d_busy / (d_busy + d_wait)

    def training_queue_depth(self) -> float:
        """Rows generated and not yet handed to the trainer (freed rows are forgotten)."""
        if self._tq is None:
            from asyncflow.core.tq.client import TQClient

            self._tq = TQClient(self.ctx.directory, consumer=names.PLANNER)
        generated = self._tq.task_status(names.TASK_ROLLOUT).num_acked
        taken = sum(self._tq.task_status(names.TASK_TRAIN).num_pending.values())
        return float(max(0, generated - taken))

    def _measure(self, obs: online.StepObservation) -> None:
        m = self.measuring
        assert m is not None  # on_step calls this only while a move is measured
        m["after"].append(obs)
        if len(m["after"]) < self.config.measure_steps:
            return
        self.measuring = None
        decision: online.MoveDecision = m["decision"]
        gain = online.measured_gain(m["before"], m["after"])
        mean = lambda xs: sum(o.step_s for o in xs) / len(xs)  # noqa: E731
        cost = move_cost.measured_cost(m["before"], m["during"], wall_s=sum(o.step_s for o in m["during"]))
        self.costs[decision.to_role] = cost
        move = f"{decision.num_workers} {decision.from_role} -> {decision.to_role}"
        self._log(
            "measured",
            step=obs.step,
            predicted_gain=round(decision.predicted_gain, 4),
            measured_gain=round(gain, 4),
            step_s_before=round(mean(m["before"]), 4),
            step_s_after=round(mean(m["after"]), 4),
            predicted_step_s_after=round(decision.predicted_step_s_after, 4),
            cost_s=round(cost.cost_s, 3),
            wall_s=round(cost.wall_s, 3),
            move=move,
        )
        if gain >= 0 or m["revert"]:
            return
        self.did_not_pay[decision.to_role] = (
            f"the move {move} after step {m['before'][-1].step + 1} did not pay: a step took {mean(m['after']):.3f} s after it "
            f"against {mean(m['before']):.3f} s before ({gain:+.0%}); no move towards {decision.to_role} for the rest of the run"
        )
        if self.num_steps - 1 - obs.step < 2:  # too late to go back (it would race the final checkpoint)
            return
        back = move_cost.reverse(decision, m["split_before"], mean(m["before"]), mean(m["after"]))
        self._log("revert", step=obs.step, move=f"{back.num_workers} {back.from_role} -> {back.to_role}", reason=back.reason)
        self._hand(back, obs.step, m["after"], revert=True)  # the steps since the move motivate its revert

    # -- deciding ------------------------------------------------------------------------
    def _decide(self, step: int) -> None:
        if self.cores:
            decision = shared_cores.decide(self.history, self.split, self.cores, self.config.max_rollout_replicas, self.policy)
        else:
            decision = online.decide(self.history, self.split, self.policy)
        if decision is None:
            return
        kind, held = self._held(decision, step)
        if held:
            if kind != self.held_reason:  # once per reason, not per step (its figures move every step)
                self._log("held", step=step, reason=held, predicted_gain=round(decision.predicted_gain, 4))
            self.held_reason = kind
            return
        self.held_reason = ""
        self._hand(decision, step, self.history[-self.policy.patience_steps :])

    def _hand(self, decision: online.MoveDecision, step: int, window: list[online.StepObservation], revert: bool = False) -> None:
        """Log ``decision`` and hand it to the driver; ``window``: the steps that motivated it."""
        self.pending = decision
        self.reverting = revert
        self.decided_on = window
        self.during = []
        cost = self.costs[decision.to_role]
        record = self._log(
            "decision",
            step=step,
            move=f"{decision.num_workers} {decision.from_role} -> {decision.to_role}",
            split_before=self.split_dict(),
            split_after=msgspec.to_builtins(decision.split_after),
            predicted_step_s_before=round(decision.predicted_step_s_before, 4),
            predicted_step_s_after=round(decision.predicted_step_s_after, 4),
            predicted_gain=round(decision.predicted_gain, 4),
            reason=decision.reason,
            cost=f"{cost.cost_s:.1f} s ({'measured' if cost.measured else 'planner.move_cost_s, not yet measured'})",
            window=[msgspec.to_builtins(o) for o in window],
        )
        self.decisions.append(record)
        self.apply(decision)

    def _held(self, decision: online.MoveDecision, step: int) -> tuple[str, str]:
        """(the kind of reason, the reason) a move is held, or ("", "")."""
        after = decision.split_after
        limit = self.config.max_rollout_replicas
        if after.rollout_workers > limit:
            return "limit", (
                f"rollout needs more workers but already runs {len(self.replicas)} replicas "
                f"(planner.max_rollout_replicas = {limit}; raise it to allow more)"
            )
        if decision.to_role in self.did_not_pay:
            return "did_not_pay", self.did_not_pay[decision.to_role]
        steps_left = self.num_steps - 1 - step
        cost = self.costs[decision.to_role]
        net = move_cost.net_gain_s(decision, steps_left, cost)
        if net <= 0:
            source = "measured at the last move" if cost.measured else f"planner.move_cost_s = {self.config.move_cost_s:g}"
            return "cost", (
                f"{decision.num_workers} {decision.from_role} -> {decision.to_role} would save "
                f"{decision.predicted_step_s_before - decision.predicted_step_s_after:.3f} s a step over the "
                f"{steps_left} steps left, less than its cost ({cost.cost_s:.1f} s, {source}; in place after "
                f"{cost.wall_s:.1f} s): net {net:+.1f} s"
            )
        return "", ""

    def _log(self, event: str, quiet: bool = False, **fields) -> dict:
        record = {"event": event, "time": round(time.time(), 3), **fields}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if not quiet:
            click.echo(f"planner: {event} " + " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("window", "policy")))
        return record
