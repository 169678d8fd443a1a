"""summary.json keeps every restart of an ``afctl up``, also those of a launch that was
lost and resumed automatically (``cluster.max_resumes``). Found by tests/chaos/
test_chaos_scale.py: a pack of rollout replicas restarted, then the queue was lost and the
run resumed itself; summary.json named no restart. The driver's parts are stand-ins here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from asyncflow.actors.driver import launcher
from asyncflow.actors.driver import preflight as _preflight
from asyncflow.actors.driver.supervisor import RunFailed
from asyncflow.actors.runtime import messages
from asyncflow.config.run import RunConfig


class FakeLauncher:
    """A launch whose supervisor restarted ``rollout.pack.1``; the first is then lost."""

    made: list[FakeLauncher] = []

    def __init__(self, cfg, rd, launch, estimate_s=None):
        self.n = len(FakeLauncher.made)
        FakeLauncher.made.append(self)
        self.supervisor = SimpleNamespace(restarts=[], pin_cores=0, names=lambda: ["queue"])

    def plan(self) -> None:
        pass

    def start(self) -> None:
        pass

    def wait(self):
        if self.n == 0:
            self.supervisor.restarts.append({"host": "rollout.pack.1", "why": "exited with code -9", "exit_code": -9})
            raise RunFailed("process 'queue' (queue) exited with code -9; the run cannot go on", process_lost=True)
        self.supervisor.restarts.append({"host": "rollout.pack.2", "why": "exited with code -9", "exit_code": -9})
        return messages.RunFinished(last_step=3, checkpoint="")

    def role_stats(self) -> dict:
        return {}

    def stop(self) -> None:
        pass


@pytest.mark.timeout(30)
def test_an_automatic_resume_keeps_the_restarts_of_the_launch_it_replaces(tmp_path, monkeypatch):
    cfg = RunConfig()
    cfg.cluster.max_resumes = 1
    info = SimpleNamespace(model_dir="", reward_model_dir="", data_path="", base_model_dir="", start_step=0)
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    monkeypatch.setattr(launcher, "prepare_new", lambda cfg, rd: (cfg, tmp_path, info))
    monkeypatch.setattr(launcher, "prepare_resume", lambda rd, overrides=(): (cfg, tmp_path, info))
    monkeypatch.setattr(launcher, "latest_good_checkpoint", lambda rd: (tmp_path / "checkpoints" / "step_000002", []))
    monkeypatch.setattr(launcher, "Launcher", FakeLauncher)
    monkeypatch.setattr(launcher, "rollout_engine_line", lambda *a: "rollout engine: native")  # no model here
    monkeypatch.setattr(_preflight, "check", lambda *a: "preflight")
    monkeypatch.setattr(_preflight, "mean_prompt_tokens", lambda *a: 6.0)
    monkeypatch.setattr(_preflight, "launch_step_estimate", lambda *a: SimpleNamespace(seconds=1.0, line="estimate"))
    FakeLauncher.made = []
    summary = launcher.run(cfg, tmp_path)
    assert len(FakeLauncher.made) == 2
    assert [r["host"] for r in summary["restarts"]] == ["rollout.pack.1", "rollout.pack.2"]
    assert len(summary["resumes"]) == 1 and "queue" in summary["resumes"][0]["error"]
