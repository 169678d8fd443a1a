"""`afctl plan`: the table, the JSON line, the simulation files, and errors that say what to change."""

import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from asyncflow.cli.main import main
from asyncflow.planner.calibration import Efficiency, Profile
from asyncflow.planner.io import save_profile

KEYS = {"rollout_devices", "train_devices", "reference_devices", "predicted_step_s", "predicted_samples_per_s", "bottleneck"}


def _run(*args):
    result = CliRunner().invoke(main, ["plan", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_json_output_is_one_object_on_the_last_line_with_the_plans_best_first():
    # a streamed rollout: calls of 4 groups that each wait for their longest response gain nothing at this scale
    out = _run("--model", "32b", "--npus", "512", "--rollout", "stream", "--json")
    payload = json.loads(out.strip().splitlines()[-1])
    plans = payload["plans"]
    assert plans and all(KEYS <= set(p) for p in plans)
    steps = [p["predicted_step_s"] for p in plans]
    assert steps == sorted(steps)
    assert all(p["rollout_devices"] + p["train_devices"] + p["reference_devices"] == 512 for p in plans)
    assert payload["predicted_async_speedup"] > 1


def test_the_table_shows_roles_rates_bottleneck_memory_and_the_sync_alternative():
    out = _run("--model", "7b", "--gpus", "64", "--hardware", "h100", "--top", "3")
    lines = out.splitlines()
    assert "h100" in lines[0] and "qwen2.5-7b" in lines[0]
    assert "rollout devices (instances x tp)" in lines[1] and "samples/s" in lines[1] and "peak GiB/dev" in lines[1]
    assert [line.split()[0] for line in lines[2:5]] == ["1", "2", "3"] and not lines[5][:2].strip().isdigit()
    assert any(line.startswith("sync alternative:") and "speedup" in line for line in lines)


def test_workload_options_change_the_prediction():
    base = json.loads(_run("--model", "7b", "--gpus", "32", "--json").splitlines()[-1])["plans"][0]
    longer = json.loads(_run("--model", "7b", "--gpus", "32", "--response-len", "4096", "--json").splitlines()[-1])["plans"][0]
    assert longer["predicted_step_s"] > base["predicted_step_s"]


def test_a_profile_file_changes_the_prediction(tmp_path):
    path = tmp_path / "h100.json"
    save_profile(Profile(hardware="h100", efficiency=Efficiency(decode_bandwidth=0.2, train_flops=0.1)), path)
    base = json.loads(_run("--model", "7b", "--gpus", "32", "--json").splitlines()[-1])["plans"][0]
    slow = json.loads(_run("--model", "7b", "--gpus", "32", "--profile", str(path), "--json").splitlines()[-1])["plans"][0]
    assert slow["predicted_step_s"] > 2 * base["predicted_step_s"]


def test_simulate_writes_a_trace_and_a_png(tmp_path):
    out = _run("--model", "7b", "--gpus", "16", "--batch-size", "32", "--simulate", str(tmp_path), "--steps", "3")
    assert "simulated 3 steps" in out
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_a_model_that_fits_nowhere_says_what_to_change():
    result = CliRunner().invoke(main, ["plan", "--model", "72b", "--npus", "4"])
    assert result.exit_code != 0
    assert "short by" in result.output and "use more devices" in result.output


def test_device_count_and_names_are_checked_with_a_hint():
    result = CliRunner().invoke(main, ["plan", "--model", "7b"])
    assert result.exit_code != 0 and "--npus" in result.output
    result = CliRunner().invoke(main, ["plan", "--model", "9b", "--gpus", "8"])
    assert result.exit_code != 0 and "preset" in result.output


def test_plan_help_imports_neither_torch_nor_numpy_nor_matplotlib():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from asyncflow.cli.main import main\n"
        "r = CliRunner().invoke(main, ['plan', '--help'])\n"
        "assert r.exit_code == 0 and '--npus' in r.output, r.output\n"
        "r = CliRunner().invoke(main, ['plan', '--model', '7b', '--gpus', '8'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(sorted(m for m in ('torch', 'numpy', 'matplotlib', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.timeout(30)
def test_a_rollout_cell_reads_as_devices_then_instances_times_tp():
    row = _run("--model", "7b", "--gpus", "64", "--hardware", "h100", "--top", "1").splitlines()[2]
    devices, instances, tp = re.match(r"\s*1\s+(\d+) \((\d+) x tp(\d+)\)", row).groups()
    assert int(instances) * int(tp) == int(devices), row


@pytest.mark.timeout(30)
def test_an_unknown_model_is_reported_before_a_missing_device_count():
    result = CliRunner().invoke(main, ["plan", "--model", "13x"])
    assert result.exit_code != 0
    assert "unknown model '13x'" in result.output and "0.5b" in result.output, result.output
    assert "--npus" not in result.output, result.output


@pytest.mark.parametrize(
    "model,gpus",
    [
        ("qwen3-8b", 16),
        ("qwen3-30b-a3b", 64),
        ("qwen3-235b-a22b", 128),  # 3.8 TB of training state: not on 64 H100s
        ("llama3-8b", 16),
        ("llama3-70b", 64),
        ("gemma3-27b", 64),
        ("mixtral-8x7b", 64),
    ],
)
def test_the_models_users_bring_are_planned_by_name(model, gpus):
    out = _run("--model", model, "--gpus", str(gpus), "--top", "1")
    assert re.search(r"\(\d+\.\dB params", out.splitlines()[0]), out
    assert out.splitlines()[2].split()[0] == "1", out


def test_a_mixture_of_experts_names_its_active_parameters_and_the_help_its_presets():
    first = _run("--model", "qwen3-30b-a3b", "--npus", "64", "--top", "1").splitlines()[0]
    assert "30.5B params, 3.4B active per token" in first, first  # 3.35B: its card says 3.3B
    help_text = " ".join(_run("--help").split())
    assert all(name in help_text for name in ("qwen3-30b-a3b", "gemma3-27b", "mixtral-8x7b", "config.json")), help_text


def test_a_config_json_path_or_its_directory_is_a_model(tmp_path):
    cfg = {
        "model_type": "mixtral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "vocab_size": 32000,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for source in (tmp_path / "config.json", tmp_path):
        first = _run("--model", str(source), "--gpus", "32", "--top", "1").splitlines()[0]
        assert "46.7B params, 12.9B active per token" in first, first


def test_a_model_whose_weights_outgrow_a_node_says_no_device_count_fits():
    result = CliRunner().invoke(main, ["plan", "--model", "deepseek-v3", "--gpus", "1024"])
    assert result.exit_code != 0
    assert "even at tp 8 over a whole node of h100" in result.output and "no device count fits" in result.output, result.output
    assert "use more devices" not in result.output
