"""The trainer's side of evaluations that run in the ``evaluator`` process
(``eval.where``, ``actors/evaluation/actor.py``).

``ask`` tells the evaluator to evaluate a version and counts it as outstanding;
``evaluated`` (the trainer's listener thread) keeps each answer; ``figures`` hands the
answers received so far to the step's report as ``val/*`` (the newest evaluation's;
the start evaluation's as ``val/start_*``); ``wait`` holds the run's last step until every
evaluation asked for is answered, or a timeout says the evaluator is gone.

An answer with an error, one that did not come back, and one overtaken by a newer
answer before any report took it are logged (eval.jsonl still holds every evaluation
that finished): the run goes on without their figures.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from asyncflow.actors.runtime import messages
from asyncflow.config.names import EVALUATOR

log = logging.getLogger(__name__)

MIN_WAIT_S = 300.0
"""The least time the run's last step waits for its evaluations (3x the longest
evaluation so far when that is more)."""


class RemoteEvals:
    def __init__(self, tell: Callable[[str, object], None]):
        """``tell(name, message)``: a tell to an actor by name."""
        self._tell = tell
        self._cond = threading.Condition()
        self._outstanding = 0
        self._answers: list[messages.Evaluated] = []
        self._longest_s = 0.0

    def ask(self, request: messages.Evaluate) -> None:
        with self._cond:
            self._outstanding += 1
        try:
            self._tell(EVALUATOR, request)
        except Exception as exc:  # the evaluator is not there (restarting): the run goes on without these figures
            with self._cond:
                self._outstanding -= 1
            log.warning("could not ask the evaluator to evaluate version %d (%s): no figures for it", request.version, exc)

    def evaluated(self, answer: messages.Evaluated) -> None:
        """An ``Evaluated`` (listener thread)."""
        with self._cond:
            self._outstanding = max(0, self._outstanding - 1)
            self._answers.append(answer)
            self._longest_s = max(self._longest_s, answer.values.get("val/time_s", 0.0))
            self._cond.notify_all()

    def wait(self) -> None:
        """Until every evaluation asked for is answered (the run's last step)."""
        with self._cond:
            timeout_s = max(MIN_WAIT_S, 3 * self._longest_s)
            if not self._cond.wait_for(lambda: self._outstanding == 0, timeout=timeout_s):
                log.warning(
                    "%d evaluation(s) did not come back within %.0f s (the evaluator failed or restarted: see its log); "
                    "the run ends without their figures",
                    self._outstanding,
                    timeout_s,
                )

    def figures(self) -> dict[str, float]:
        """The ``val/*`` of the answers received since the last call."""
        with self._cond:
            answers, self._answers = self._answers, []
        out: dict[str, float] = {}
        done = []
        for a in answers:
            if a.error:
                log.warning("the evaluation of version %d failed in the evaluator: %s", a.version, a.error)
            elif not a.values:  # skipped: a newer version was evaluated instead
                continue
            elif a.start:
                out["val/start_accuracy"] = a.values["val/accuracy"]
                out["val/start_reward_mean"] = a.values["val/reward_mean"]
            else:
                done.append(a)
        if done:
            newest = max(done, key=lambda a: a.version)
            for a in done:
                if a is not newest:
                    log.info("val/* of version %d: in eval.jsonl (version %d's reached this step too)", a.version, newest.version)
            out.update(newest.values)
        return out
