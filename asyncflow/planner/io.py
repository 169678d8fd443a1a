"""The planner's I/O: everything that reads or writes a file, or draws.

The planner's other modules are pure functions and never import this one
(tests/test_layers.py checks it); the CLI (`afctl plan`, `afctl profile`) and the
driver's preflight call these.

- profiles: `save_profile` / `load_profile` (JSON or TOML by the file's suffix);
- model shapes from a local Hugging Face directory: `from_hf_config`, `get_model` (GPT-2's field
  names too: `common_names`; the text model's fields of any family: `text_model_fields`);
- a simulated plan's trace.json and timeline PNG: `simulate_plan`, `draw_timeline`
  (numpy and matplotlib imported only there: `afctl plan` without `--simulate`
  imports neither).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from asyncflow.planner.calibration import Efficiency, Profile
from asyncflow.planner.cost import Workload
from asyncflow.planner.cpu_peak import CpuPeak, parse_cpuinfo
from asyncflow.planner.hardware import Hardware
from asyncflow.planner.models import PRESETS, ModelShape, shape_from_hf_config

if TYPE_CHECKING:  # numpy comes with the simulation: imported only where it is drawn or written
    from asyncflow.planner.simulate import ModeRun, SimResult


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return (
            "nan" if value != value else ("inf" if value == float("inf") else "-inf" if value == float("-inf") else repr(value))
        )
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic strings
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _to_toml(data: dict) -> str:
    """TOML of a profile: scalars, then tables, then arrays of tables (no tomli_w needed)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, (dict, list))]
    for key, table in ((k, v) for k, v in data.items() if isinstance(v, dict)):
        lines += ["", f"[{key}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    for key, rows in ((k, v) for k, v in data.items() if isinstance(v, list)):
        for row in rows:
            lines += ["", f"[[{key}]]"] + [f"{k} = {_toml_value(v)}" for k, v in row.items()]
    return "\n".join(lines) + "\n"


def save_profile(profile: Profile, path: str | Path) -> None:
    path = Path(path)
    if path.suffix == ".toml":
        path.write_text(_to_toml(msgspec.to_builtins(profile)))
    else:
        path.write_bytes(msgspec.json.format(msgspec.json.encode(profile), indent=2))


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no profile at {path}: create one with `afctl profile --out {path}`")
    data = path.read_bytes()
    try:
        if path.suffix == ".toml":
            return msgspec.toml.decode(data, type=Profile)
        return msgspec.json.decode(data, type=Profile)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{path} is not a planner profile ({exc}); recreate it with `afctl profile`") from exc


GPT2_NAMES = {
    "n_layer": "num_hidden_layers",
    "n_embd": "hidden_size",
    "n_head": "num_attention_heads",
    "n_inner": "intermediate_size",
    "n_positions": "max_position_embeddings",
}
"""The fields GPT-2 and the families that copied it name their own way."""


def common_names(cfg: dict) -> dict:
    """A config.json's fields with GPT-2's names (``n_layer``, ``n_embd``, ...) also under
    the names most families use (``num_hidden_layers``, ``hidden_size``, ...; an unset
    ``n_inner`` is 4 x ``n_embd``)."""
    out = dict(cfg)
    for theirs, ours in GPT2_NAMES.items():
        if out.get(theirs) is not None and ours not in out:
            out[ours] = out[theirs]
    if "n_embd" in out and out.get("intermediate_size") is None:
        out["intermediate_size"] = 4 * out["n_embd"]
    return out


def text_model_fields(cfg: dict) -> dict:
    """The text model's fields of a config.json read into a dict (``common_names``): a
    multimodal model's ``text_config`` (Gemma 3) over the top level."""
    text = cfg.get("text_config")
    return common_names({**cfg, **text} if isinstance(text, dict) else cfg)


def read_hf_config(path: str | Path) -> dict:
    """``text_model_fields`` of a model directory's config.json (or of that file)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    return text_model_fields(json.loads(path.read_text()))


def from_hf_config(path: str | Path) -> ModelShape:
    """Read a local Hugging Face model directory or its config.json (``common_names``:
    GPT-2's too; a multimodal model's ``text_config`` is ``shape_from_hf_config``'s)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"no config.json at {path}: pass a preset ({', '.join(PRESETS)}) or a model directory")
    return shape_from_hf_config(common_names(json.loads(path.read_text())), name=path.parent.name, source=str(path))


def get_model(name_or_path: str) -> ModelShape:
    """A preset by name, or the shape of a local Hugging Face model directory."""
    key = name_or_path.lower()
    if key in PRESETS:
        return PRESETS[key]
    if Path(name_or_path).exists():
        return from_hf_config(name_or_path)
    raise ValueError(f"unknown model {name_or_path!r}: choose a preset ({', '.join(PRESETS)}) or a local HF model directory")


def draw_timeline(runs: list[ModeRun], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    horizon = max(r.total_s for r in runs)
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 2.2 + 0.45 * 8 * len(runs)), sharex=True)
    cmap = plt.get_cmap("tab10")
    for ax, run in zip(np.atleast_1d(axes), runs):
        lanes = ["rollout slots busy"] + list(dict.fromkeys(s.lane for s in run.spans))
        series = np.asarray(run.rollout_busy_series)
        ax.fill_between(series[:, 0], 0.4, 0.4 - 0.8 * series[:, 1], color="grey", step="post")
        for y, lane in enumerate(lanes[1:], 1):
            for s in (s for s in run.spans if s.lane == lane):
                # Overlapping generation of consecutive steps: even steps upper half, odd lower.
                if lane.startswith("rollout"):
                    box = (y - 0.4, 0.4) if s.step % 2 == 0 else (y, 0.4)
                else:
                    box = (y - 0.4, 0.8)
                ax.broken_barh([(s.start_s, s.end_s - s.start_s)], box, color=cmap(s.step % 10), alpha=0.85)
        ax.set_yticks(range(len(lanes)), lanes)
        ax.invert_yaxis()
        ax.set_xlim(0, horizon)
        ax.set_title(f"{run.mode}: {run.step_s:.1f} s/step, rollout slots busy {run.rollout_busy_fraction:.0%}", fontsize=10)
    np.atleast_1d(axes)[-1].set_xlabel("time (s); colour = step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def simulate_plan(
    model: ModelShape,
    hw: Hardware,
    eff: Efficiency,
    wl: Workload,
    plan,
    num_steps: int = 6,
    out_dir: str | Path | None = None,
    seed: int = 0,
) -> SimResult:
    """Simulate one plan (`planner.simulate`); with ``out_dir``, write trace.json and timeline.png there."""
    from asyncflow.planner.simulate import chrome_trace, simulate_result, timeline_title

    result, runs = simulate_result(model, hw, eff, wl, plan, num_steps, seed)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        trace = out / "trace.json"
        trace.write_text(json.dumps(chrome_trace(runs)))
        png = out / "timeline.png"
        draw_timeline(runs, png, timeline_title(model, hw, plan))
        result.trace_path, result.png_path = str(trace), str(png)
    return result


def local_cpu_peak(path: str = "/proc/cpuinfo") -> CpuPeak | None:
    """``cpu_peak.parse_cpuinfo`` of this host; None where the file cannot be read (not Linux)."""
    try:
        return parse_cpuinfo(Path(path).read_text())
    except OSError:
        return None
