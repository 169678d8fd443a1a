"""Seeing the pipeline, on one real run shared by the module: the run is held at its
first reward (a gate file) so the cluster stays up for `afctl status` and the hang
report fires; then the gate opens, the run finishes, and its trace and metrics are
drawn."""

from __future__ import annotations

import json
import re
import struct

import pytest
from obs_helpers import Run, afctl, write_config

WORKERS = ["loader", "rollout.0", "reward.0", "trainer"]


class Observed:
    def __init__(self, run: Run, status_out: str, status_json: dict, exit_code: int, status_after: str):
        self.run_dir = run.run_dir
        self.output = run.output
        self.status_out = status_out
        self.status_json = status_json
        self.exit_code = exit_code
        self.status_after = status_after  # `afctl status` once the run has ended


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> Observed:
    tmp = tmp_path_factory.mktemp("observe")
    gate = tmp / "gate"
    config = write_config(tmp / "gated.toml", num_steps=3, reward="obs_gate:gated_reward", hang_timeout_s=3)
    private_tmp = tmp / "t"  # the pointer to the current run lives in TMPDIR: no other run can take it over
    private_tmp.mkdir()
    run = Run(config, tmp / "run", OBS_GATE=str(gate), TMPDIR=str(private_tmp))
    try:
        run.wait_for_line("no trainer step completed", timeout_s=200)
        run.wait_for_line("  Python stacks of every process: ", timeout_s=60)  # the report's last line, once written
        status = afctl("status", TMPDIR=str(private_tmp))  # no RUN_DIR: the latest run started here
        status_json = afctl("status", str(run.run_dir), "--json")
        gate.touch()
        code = run.finish(timeout_s=120)
        after = afctl("status", str(run.run_dir))
    finally:
        gate.touch()
        run.kill()
        (tmp / "afctl-up.log").write_text(run.output)  # kept under pytest's basetemp for a look after a failure
    assert status.returncode == 0, status.stdout + status.stderr
    assert status_json.returncode == 0, status_json.stdout + status_json.stderr
    return Observed(run, status.stdout, json.loads(status_json.stdout), code, after.stdout + after.stderr)


@pytest.mark.timeout(400)
def test_the_hang_report_fires_on_a_stalled_reward_and_names_it(observed):
    out = observed.output
    report = out[out.index("no trainer step completed") :]
    reward_line = report.split("\n  reward.0 ")[1].splitlines()[0]
    assert "NO ANSWER" in reward_line or "state score" in reward_line, report[:2000]
    assert "most likely stalled:" in report
    assert "task reward" in report and "task train" in report
    block = report.split("  Python stacks of every process: ")
    stacks_file = observed.run_dir.absolute() / "logs" / "stall-1.txt"
    assert block[1].splitlines()[0] == str(stacks_file)
    assert "File " not in block[0]  # the stacks are in the file, not on the terminal
    stacks = stacks_file.read_text().split("--- Python stacks of process reward.0 ")[1].split("--- Python stacks of")[0]
    assert "in gated_reward" in stacks  # the stalled function, in the stalled process's stack


@pytest.mark.timeout(400)
def test_status_lists_every_actor_of_the_running_cluster(observed):
    text = observed.status_out
    for name in WORKERS + ["tq.manager", "tq.shard.0", "tq.controller.train", "weights", "collector"]:
        assert f"\n{name} " in text, text
    reward_line = text.split("\nreward.0 ")[1].splitlines()[0]
    assert "NO ANSWER" in reward_line or "score" in reward_line, text
    names = {a["name"]: a for a in observed.status_json["actors"]}
    assert set(WORKERS) <= set(names)
    assert all(names[n]["pid"] > 0 for n in WORKERS)
    assert names["trainer"]["version"] == 0 and 0.0 <= names["trainer"]["busy"] <= 1.0
    assert set(observed.status_json["tasks"]) == {"rollout", "reward", "train"}
    assert text.startswith(f"run {observed.run_dir}")


@pytest.mark.timeout(400)
def test_status_leaves_the_run_alone_and_shows_the_rosters_own_facts(observed):
    roster_line = observed.status_out.split("\nroster ")[1].splitlines()[0]
    assert "NO ANSWER" not in roster_line and "replicas: rollout.0" in roster_line, observed.status_out
    names = {a["name"]: a for a in observed.status_json["actors"]}
    assert names["roster"]["replicas"] == ["rollout.0"]
    # the run's own output: no warning from the two status calls made while it ran
    assert "rejected a frame" not in observed.output and "GetRoleStats" not in observed.output, observed.output[-3000:]


@pytest.mark.timeout(400)
def test_the_run_names_its_steps_as_the_progress_lines_do(observed):
    assert "steps 1..3)" in observed.output  # the start line: the three steps are 1, 2 and 3
    progress = [line.split("|")[0].split()[1] for line in observed.output.splitlines() if re.match(r"step +\d+/", line)]
    assert progress == ["1/3", "2/3", "3/3"]


@pytest.mark.timeout(400)
def test_status_of_an_ended_run_says_it_is_not_running(observed):
    assert f"run {observed.run_dir} is not running: it ended" in observed.status_after


@pytest.mark.timeout(400)
def test_the_trace_is_valid_chrome_json_with_a_track_per_actor_and_no_span_longer_than_the_run(observed):
    from asyncflow.cli.runs import run_wall_s, timeline, validate_trace

    assert observed.exit_code == 0, observed.output[-3000:]
    trace = json.loads((observed.run_dir / "trace.json").read_text())
    wall_s = run_wall_s(observed.run_dir)
    assert validate_trace(trace, max_run_s=wall_s) == []
    tl = timeline(trace)
    assert list(tl.tracks) == WORKERS
    assert tl.end_s <= wall_s
    assert max(s.duration_s for spans in tl.tracks.values() for s in spans) <= wall_s
    assert any(s.name == "score" and s.duration_s > 3 for s in tl.tracks["reward.0"])  # the stall is visible
    assert tl.num_flows >= 1 and tl.counters.get("staleness") == 3


@pytest.mark.timeout(400)
def test_afctl_trace_and_plot_write_valid_pngs(observed, tmp_path):
    for command, png in (("trace", tmp_path / "trace.png"), ("plot", tmp_path / "plot.png")):
        result = afctl(command, str(observed.run_dir), "--png", str(png))
        assert result.returncode == 0, result.stdout + result.stderr
        head = png.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
        width, height = struct.unpack(">II", head[16:24])
        assert width > 300 and height > 200


def test_a_corrupt_trace_is_reported_with_what_is_wrong():
    from asyncflow.cli.runs import validate_trace

    trace = {
        "traceEvents": [
            {"ph": "X", "name": "generate", "ts": 0, "dur": 5e6, "pid": 1, "tid": 0},
            {"ph": "X", "name": "train", "ts": 0, "pid": 2},
            {"ph": "s", "name": "weights v1", "id": 7, "ts": 0, "pid": 2},
        ]
    }
    problems = validate_trace(trace, max_run_s=1.0)
    assert any("longer than the run" in p for p in problems)
    assert any("missing ['dur']" in p for p in problems)
    assert any("track 1 has spans but no process_name" in p for p in problems)
    assert any("flow 7" in p for p in problems)
    assert validate_trace([]) == ["not a Chrome trace object: no 'traceEvents' list"]
