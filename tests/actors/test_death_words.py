"""How the driver names a host's death: a SIGKILL while the kernel counted an out-of-memory
kill is called one, with the run's estimate and what to change; one the count cannot tell
says both causes. The cgroup's files are planted in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncflow.actors.driver import topology
from asyncflow.actors.driver._oom import OomCount, cgroup_oom_file, death_words, oom_kills
from asyncflow.actors.driver.supervisor import RunFailed, Supervisor
from asyncflow.config import names
from asyncflow.config.load import load_config_text

EMULATED = '[rollout.engine]\ntype = "emulated"\n[train.engine]\ntype = "emulated"\n'
V2_EVENTS = "low 0\nhigh 0\nmax 12\noom 1\noom_kill {n}\noom_group_kill 0\n"


class Proc:
    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def alive(self) -> bool:
        return self.returncode is None

    def kill(self) -> None:
        self.returncode = -9


def _supervisor() -> Supervisor:
    cfg = load_config_text(EMULATED)
    sup = Supervisor(cfg, Path("/run"))
    sup.plan(topology.plan_hosts(cfg, "/run"))
    for k, name in enumerate(sup.names()):
        sup._hosts[name].proc = Proc(1000 + k)
    return sup


@pytest.mark.timeout(10)
def test_a_trainer_killed_while_the_cgroup_counted_an_oom_kill_is_named_an_out_of_memory_kill(tmp_path):
    events = tmp_path / "memory.events"
    events.write_text(V2_EVENTS.format(n=3))
    sup = _supervisor()
    sup.oom = OomCount(events)
    sup.memory_estimates = lambda: {names.TRAINER: 1.5 * (1 << 30), "rollout.0": 0.25 * (1 << 30)}
    sup.check()  # every host alive: this look's count (3) is what a death is compared with
    events.write_text(V2_EVENTS.format(n=4))  # the kernel killed one
    sup._hosts[names.TRAINER].proc.kill()
    with pytest.raises(RunFailed) as caught:
        sup.check()
    text = str(caught.value)
    assert "process 'trainer' (trainer) exited with code -9: killed by the kernel for lack of memory (out-of-memory" in text
    assert "the run's estimate for it: about 1.50 GiB" in text
    assert "train.engine.micro_batch_size" in text and caught.value.process_lost


@pytest.mark.timeout(10)
def test_a_sigkill_the_cgroup_did_not_count_is_a_kill_9_and_one_nobody_can_tell_says_both(tmp_path):
    events = tmp_path / "memory.events"
    events.write_text(V2_EVENTS.format(n=3))
    sup = _supervisor()
    sup.oom = OomCount(events)
    sup.check()
    sup._hosts[topology.QUEUE].proc.kill()
    with pytest.raises(RunFailed, match=r"exited with code -9: killed by signal 9 \(SIGKILL: a kill -9; the kernel's"):
        sup.check()
    blind = _supervisor()  # no cgroup count to read (a Ray host, a system without one)
    blind._hosts[topology.QUEUE].proc.kill()
    with pytest.raises(RunFailed, match=r"killed by signal 9 \(SIGKILL: an out-of-memory kill or a kill -9\)"):
        blind.check()


def test_the_words_for_exit_codes_and_other_signals():
    assert death_words(3, None, None) == "exited with code 3"
    assert death_words(-11, 0, 0) == "exited with code -11: killed by signal 11 (SIGSEGV)"
    assert "fewer rollout.num_replicas" in death_words(-9, 0, 1, role="rollout")
    assert "(out-of-memory); to fit, use" in death_words(-9, 0, 1)  # no estimate for it: none is named


def test_the_cgroup_file_is_found_for_v1_v2_and_hybrid_layouts(tmp_path):
    v1 = tmp_path / "memory" / "jobs" / "a" / "memory.oom_control"
    v1.parent.mkdir(parents=True)
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
    assert cgroup_oom_file("5:devices:/\n4:memory:/jobs/a\n0::/\n", tmp_path) == v1
    assert oom_kills(v1) == 7
    v2 = tmp_path / "user.slice" / "memory.events"
    v2.parent.mkdir()
    v2.write_text(V2_EVENTS.format(n=2))
    assert cgroup_oom_file("0::/user.slice\n", tmp_path) == v2 and oom_kills(v2) == 2
    hybrid = tmp_path / "unified" / "job" / "memory.events"
    hybrid.parent.mkdir(parents=True)
    hybrid.write_text(V2_EVENTS.format(n=0))
    assert cgroup_oom_file("1:name=systemd:/\n0::/job\n", tmp_path) == hybrid
    assert cgroup_oom_file("0::/nowhere\n", tmp_path) is None and oom_kills(tmp_path / "none") is None
    (tmp_path / "old").write_text("oom_kill_disable 0\nunder_oom 0\n")  # a kernel that does not count
    assert oom_kills(tmp_path / "old") is None
