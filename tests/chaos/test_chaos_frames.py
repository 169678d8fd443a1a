"""Hostile frames (values nested thousands deep, huge declared lengths, wrong types, bit
flips, truncations, garbage, wrong secrets) sent to every live listener of a running
run, found through its directory (RUN_DIR/cluster.json). Each frame gets an answer,
training goes on, and the run completes: every group trained exactly once, no process left."""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path

import msgspec
import pynng
import pytest
from chaos_helpers import ChaosRun, rng_for

pytestmark = pytest.mark.chaos

_spec = importlib.util.spec_from_file_location(
    "fuzz_frames", Path(__file__).resolve().parents[1] / "core" / "test_fuzz_listeners.py"
)
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)  # its frame generator (_fuzz_frame), one source for both


def _send_hostile_frames(run_dir: Path, seed: int, per_listener: int, report: dict) -> None:
    from asyncflow.core import frames
    from asyncflow.core.directory import DirectoryClient
    from asyncflow.core.transport import TransportConfig

    cluster = json.loads((run_dir / "cluster.json").read_text())
    transport = msgspec.convert(cluster["transport"], TransportConfig)
    entries = [(e.name, e.address) for e in DirectoryClient(cluster["directory"], transport).list()]
    targets = [("directory", cluster["directory"]), *entries]
    report["targets"] = [name for name, _ in targets]
    rng = rng_for(seed)
    for name, address in targets:
        with pynng.Req0(recv_timeout=10_000, send_timeout=10_000, recv_max_size=1 << 20) as raw:
            raw.dial(address, block=True)
            for _ in range(per_listener):
                raw.send(fuzz._fuzz_frame(rng, name))
                head, _ = frames.split_frame(raw.recv())  # a dead listener times out here
                reply = frames.decode_reply_header(head)
                report["answers"] = report.get("answers", 0) + 1
                report.setdefault("errors", set()).add(reply.error_type if not reply.ok else "ok")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [700])
def test_hostile_frames_to_every_live_listener_leave_the_run_training_exactly_once(tmp_path, seed):
    run = ChaosRun(tmp_path, seed, num_steps=14).start()  # long enough to train while every frame is sent
    run.wait_for_step(2)
    steps_before_fuzz = run.steps_done()
    report: dict = {}
    sender = threading.Thread(target=_guard, args=(_send_hostile_frames, run.run_dir, seed, 100, report))
    sender.start()
    sender.join(timeout=120)
    assert not sender.is_alive(), run.why(f"the frames were not all answered within 120 s: {report}")
    assert report.get("failure") is None, run.why(f"a listener stopped answering: {report}")
    run.finish()
    # every frame was answered by its listener, so each was live when its frames came
    assert len(report["targets"]) >= 8 and report["answers"] == 100 * len(report["targets"]), run.why(str(report))
    assert steps_before_fuzz < run.num_steps, run.why("the run ended before the frames: nothing was tested")


def _guard(fn, *args) -> None:
    report = args[-1]
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001  (reported by the test, with the seed)
        report["failure"] = repr(exc)
