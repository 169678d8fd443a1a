"""Exactly once across resumes, for sessions trained from the gateway ([rollout.gateway]
train): 64 agents (threads of openai clients, two turns and a reward each, as fast as
they can) while the trainer is killed (-9: an automatic resume, ``cluster.max_resumes``),
then the serving replica (restarted in place), then the driver itself (``afctl up
--resume`` by hand). The audit: every session some client was answered ``written`` is
trained once (trained.jsonl's ``sessions``) or dropped as stale (``stale_session_ids``),
never both, never twice; or, written after the run's last step took its sessions, it is
kept for a later resume (in the last checkpoint's queue, or written after the checkpoint:
the journal writes it again). No run stops on rows of rolled-back weights."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import msgspec
import openai
import pytest
from chaos_helpers import ChaosRun, rng_for
from wf_helpers import read_jsonl

pytestmark = pytest.mark.chaos

NUM_CLIENTS = 64
PROMPTS_PER_STEP, GROUP_SIZE = 4, 2  # 8 sessions a step
NUM_STEPS = 20


class Agents:
    """``NUM_CLIENTS`` threads, each running sessions one after the other until ``stop``:
    a turn, a second turn, a reward. A request that meets a gateway down (restarting,
    resuming) is sent again to the URL RUN_DIR/gateway.json names then (a turn sent again
    gets its recorded reply); a session the gateway no longer knows (404) or has finished
    (409) is given up."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.written: set[str] = set()  # every session an answer said was written
        self.started: set[str] = set()
        self.given_up: Counter = Counter()  # by status
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._agent, args=(i,), daemon=True) for i in range(NUM_CLIENTS)]

    def start(self) -> Agents:
        for t in self.threads:
            t.start()
        return self

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)

    def _api(self) -> openai.OpenAI | None:
        try:
            url = json.loads((self.run_dir / "gateway.json").read_text())["url"]
        except (OSError, ValueError, KeyError):
            return None
        return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def _call(self, fn):
        """``fn(api)``, sent again while the gateway is down or busy; None once stopped."""
        while not self.stop.is_set():
            api = self._api()
            if api is None:
                self.stop.wait(0.2)
                continue
            try:
                return fn(api)
            except (openai.APIConnectionError, openai.APITimeoutError):
                self.stop.wait(0.2)
            except openai.APIStatusError as exc:
                if exc.status_code in (500, 502, 503, 504):  # stopping, resuming, a checkpoint's held writes
                    self.stop.wait(0.2)
                    continue
                raise
        return None

    def _agent(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            session = f"c{i}-{n}"
            n += 1
            with self.lock:
                self.started.add(session)
            try:
                self._session(session)
            except openai.APIStatusError as exc:
                with self.lock:
                    if exc.status_code in (404, 409):
                        self.given_up[exc.status_code] += 1
                    else:
                        self.errors.append(f"{session}: {exc.status_code} {exc.message}")

    def _session(self, session: str) -> None:
        chat = [{"role": "user", "content": "12+7="}]

        def turn(api):
            return api.chat.completions.create(model="m", messages=chat, user=session)

        r1 = self._call(turn)
        if r1 is None:
            return
        chat += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "7+1="}]
        r2 = self._call(turn)
        if r2 is None:
            return
        score = float(len(r2.choices[0].message.content) % 2)
        answer = self._call(lambda api: api.post(f"/asyncflow/sessions/{session}/reward", body={"reward": score}, cast_to=object))
        if answer is not None and "written" in answer["queue"]:
            with self.lock:
                self.written.update(answer["queue"]["sessions"])


def left_for_later(run_dir: Path) -> tuple[set[str], set[str]]:
    """The last checkpoint's untrained sessions (in its saved queue), and the sessions it
    accounts for (the serving replica's saved state: any other written one is written again)."""
    from asyncflow.core.tq.state import TaskSnapshot
    from asyncflow.gateway.resume import decode_state

    ckpt = max((p for p in (run_dir / "checkpoints").glob("step_*") if (p / "DONE").exists()), key=lambda p: p.name)
    snap = msgspec.msgpack.decode((ckpt / "queue" / "controller-train.msgpack").read_bytes(), type=TaskSnapshot)
    queued = {m.key for m, acked in zip(snap.metas, snap.acked) if not acked}
    roles = msgspec.msgpack.decode((ckpt / "roles.msgpack").read_bytes())
    return queued, decode_state(roles["rollout.0"]) or set()


def launch_of(run_dir: Path) -> int:
    """The run's launch now (-1 while launch.json is being written)."""
    try:
        return json.loads((run_dir / "launch.json").read_text())["launch"]
    except (OSError, ValueError, KeyError):
        return -1


def drain(proc, into: list[str]) -> threading.Thread:
    """Read the driver's output as it comes (a full pipe would block it)."""
    t = threading.Thread(target=lambda: into.extend(proc.stdout), daemon=True)
    t.start()
    return t


@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [700, 701, 702], ids=lambda v: str(v))
def test_every_session_answered_written_is_trained_once_or_dropped_across_kills_of_trainer_replica_and_driver(tmp_path, seed):
    rng = rng_for(seed)
    run = ChaosRun(
        tmp_path,
        seed,
        num_steps=NUM_STEPS,
        prompts_per_step=PROMPTS_PER_STEP,
        group_size=GROUP_SIZE,
        changes={
            "algorithm": {"group_size": GROUP_SIZE},
            "train": {"prompts_per_step": PROMPTS_PER_STEP},
            "workflow": {"staleness": 2},
            "reward": {"functions": []},
            "rollout.gateway": {
                "enabled": True,
                "port": 0,
                "train": True,
                "num_sessions": NUM_STEPS * PROMPTS_PER_STEP * GROUP_SIZE,
            },
        },
    ).start()
    outputs: list[list[str]] = [[]]
    drain(run.proc, outputs[0])
    agents = Agents(run.run_dir)
    try:
        run.wait_until("the gateway", lambda: (run.run_dir / "gateway.json").exists())
        agents.start()
        at = rng.randint(3, 6)  # after step_000002 is saved
        run.wait_for_step(at)
        time.sleep(rng.uniform(0.0, 1.0))  # the random moment within the step
        run.kill("trainer")  # the run stops; cluster.max_resumes resumes it from its last checkpoint
        run.wait_until("the automatic resume", lambda: launch_of(run.run_dir) == 1, timeout_s=240)
        run.wait_for_step(at + 2)
        time.sleep(rng.uniform(0.0, 1.0))
        run.kill("rollout.0")  # the serving replica, restarted in place: it serves its journal
        run.wait_for_step(at + 5)
        time.sleep(rng.uniform(0.0, 1.0))
        run.kill_driver()  # every host follows it; `afctl up --resume` by hand
        outputs.append([])
        run.proc = run._afctl("up", "--resume", str(run.run_dir))
        reader = drain(run.proc, outputs[-1])
        run.proc.wait(timeout=600)
        reader.join(timeout=30)
    except AssertionError as exc:  # the driver's output was drained here: say what it printed
        raise AssertionError(f"{exc}\n" + "\n====\n".join("".join(o) for o in outputs)) from exc
    finally:
        agents.close()
    out = "\n====\n".join("".join(o) for o in outputs)
    run.assert_nothing_left()
    assert run.proc.returncode == 0, run.why(f"the resume did not complete:\n{out}")
    assert f"done: {NUM_STEPS} steps" in out and "VersionMismatch" not in out, run.why(out)
    assert not agents.errors, run.why(f"requests failed: {agents.errors[:5]}")

    lines = read_jsonl(run.run_dir / "trained.jsonl")
    assert [line["step"] for line in lines] == list(range(NUM_STEPS)), run.why("a step missing or twice in trained.jsonl")
    trained = Counter(s for line in lines for s in line["sessions"])
    stale = Counter(s for line in lines for s in line["stale_session_ids"])
    twice = [s for s, n in (trained + stale).items() if n > 1]
    assert not twice, run.why(f"trained or dropped more than once: {twice[:10]}")
    assert set(trained) | set(stale) <= agents.started, run.why("a row names a session no agent started")
    queued, covered = left_for_later(run.run_dir)
    left = agents.written - set(trained) - set(stale)
    lost = {s for s in left if s in covered and s not in queued}
    assert not lost, run.why(f"{len(lost)} sessions answered written were neither trained nor dropped: {sorted(lost)[:10]}")
    stats = json.loads((run.run_dir / "gateway" / "stats.json").read_text())
    print(
        f"\nseed {seed}: {len(agents.written)} sessions answered written; {len(trained)} trained once, "
        f"{len(stale)} dropped as stale, {len(left)} left for a later resume ({len(left & queued)} in the last "
        f"checkpoint's queue); lost 0; kills: trainer after step {at}, rollout.0, driver; "
        f"the last launch replayed {stats.get('gateway/sessions_replayed', 0):g} and found "
        f"{stats.get('gateway/sessions_rolled_back', 0):g} sessions of rolled-back weights; "
        f"given up by agents: {dict(agents.given_up)}"
    )
