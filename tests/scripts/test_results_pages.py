"""The results pages (scripts/results.py, records.py, render.py): a page is a template filled from
the measurements' JSON, the paired-by-seed renderer computes its figures and verdict from the
records alone, every record's JSON has the keys its page reads, and the pages stay short."""

import copy
import json
import shutil
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import records  # noqa: E402
import render  # noqa: E402
import results  # noqa: E402

A = [0.50, 0.60, 0.61, 0.56]
B = [0.60, 0.55, 0.62, 0.58]


def test_the_paired_renderer_gives_mean_sd_standard_error_and_verdict_of_the_differences():
    p = render.Paired([0, 1, 2, 3], A, B)
    diff = [a - b for a, b in zip(A, B)]
    assert p.mean == pytest.approx(statistics.mean(diff))
    assert p.sd == pytest.approx(statistics.stdev(diff))
    assert p.se == pytest.approx(statistics.stdev(diff) / 2)
    assert p.verdict == "not met"  # the mean difference is below 0
    assert p.summary == f"{p.mean:+.3f} (sd {p.sd:.3f}, s.e. {p.se:.3f}, 4 seeds, {abs(p.mean) / p.se:.1f} s.e. from 0)"
    table = p.table("async", "TRL")
    assert table[2] == "| 0 | 0.500 | 0.600 | -0.100 |"
    assert table[-1] == f"| mean | 0.568 | 0.588 | **{p.mean:+.3f}** (sd {p.sd:.3f}, s.e. {p.se:.3f}) |"


def test_the_verdict_is_met_only_when_the_mean_difference_reaches_the_target():
    assert render.Paired([0, 1], [0.5, 0.7], [0.5, 0.6]).verdict == "met"
    assert render.Paired([0, 1], [0.5, 0.6], [0.5, 0.6]).verdict == "met"  # at least 0: a tie meets it
    assert render.Paired([0, 1], [0.5, 0.7], [0.5, 0.6], at_least=0.1).verdict == "not met"
    with pytest.raises(AssertionError):
        render.Paired([0], [0.5], [0.5])  # one seed has no spread


def entry(seed: int, trl: float, async_: float) -> dict:
    systems = {"trl": {"heldout_accuracy": trl}, "async": {"heldout_accuracy": async_}}
    return {"seed": seed, "command": f"bench peer --seed {seed}", "when": "2026-12-07 02:00", "result": {"systems": systems}}


def test_a_template_fills_a_per_seed_record_seed_by_seed_with_two_digit_seeds():
    data = {"pairs": {"runs": [entry(s, t, a) for s, (t, a) in zip((0, 1, 12), ((0.5, 0.6), (0.6, 0.6), (0.7, 0.5)))]}}
    template = "\n".join(
        [
            "# Planted",
            '@let p = paired(pairs, "systems.async.heldout_accuracy", "systems.trl.heldout_accuracy")',
            "@for run in pairs.runs",
            "- seed {run.seed}: {run.systems.async_.heldout_accuracy:.2f}",
            "@end",
            "@if p.mean < 0",
            "Behind on the mean: {p.mean:+.3f}, {p.verdict}.",
            "@end",
            '@lines p.table("async", "TRL")',
        ]
    )
    reads: set[tuple[str, str]] = set()
    text = render.render(template, data, reads)
    assert "- seed 12: 0.50" in text
    assert "Behind on the mean: -0.033, not met." in text
    assert "| 12 | 0.500 | 0.700 | -0.200 |" in text
    assert ("pairs", "systems.async.heldout_accuracy") in reads
    assert render.render(template, data) == text  # the same JSON, the same page


def test_formats_of_a_template_minutes_and_ratios():
    data = {"run": {"command": "c", "when": "w", "result": {"wall_s": 318.0, "ratio": 2.188}}}
    assert render.render("{run.wall_s:min} min, {run.ratio:.2fx}, {run.when}", data) == "5.3 min, 2.19x, w\n"


def kept() -> dict[str, dict]:
    return results.load()


def test_every_key_a_page_reads_is_in_its_records_schema_and_in_its_json():
    data = kept()
    reads: set[tuple[str, str]] = set()
    for page in records.PAGES:
        template = (ROOT / "scripts" / "pages" / f"{page}.md").read_text()
        render.render(template, data, reads, how=lambda name: results.how(name, data))
    for name, path in reads:
        if path in render.META or path == "":
            continue
        schema = records.BY_NAME[name].keys
        declared = any(path == k or k.startswith(path + ".") or path.startswith(k + ".") for k in schema)
        assert declared, f"{name} reads {path}, not in its keys"
    for record in records.RECORDS:
        if record.name not in data:
            continue
        entries = data[record.name]["runs"] if record.per_seed else [data[record.name]]
        for key in record.keys:
            for e in entries:
                assert has_path(e["result"], key.split(".")), f"{record.name}'s JSON has no {key}"


def has_path(value: object, keys: list[str]) -> bool:
    if not keys:
        return True
    if isinstance(value, list):
        return all(has_path(x, keys) for x in value)
    return isinstance(value, dict) and keys[0] in value and has_path(value[keys[0]], keys[1:])


def test_every_per_seed_record_keeps_one_entry_per_seed_with_its_own_command():
    for record in records.RECORDS:
        path = records.DATA_DIR / f"{record.name}.json"
        if record.per_seed and path.exists():
            runs = json.loads(path.read_text())["runs"]
            assert [r["seed"] for r in runs] == sorted({r["seed"] for r in runs})
            assert all(r["command"] and r["when"] for r in runs)


def test_a_per_seed_record_runs_its_command_once_per_seed():
    record = records.BY_NAME["real_paired_stream"]
    first, twelfth = results.command(record, "w", 0), results.command(record, "w", 12)
    assert "seed=12" in twelfth and "data.order_seed=12" in twelfth and "w/real_paired_stream/seed12" in twelfth
    assert [c for c in first if "seed" not in c] == [c for c in twelfth if "seed" not in c]
    parity = results.command(records.BY_NAME["parity"], "w")
    assert parity[1:] == ["scripts/convergence_parity.py", "--seeds", "0", "1", "2", "--out", "w/parity"]


def test_the_rendered_pages_are_the_templates_filled_from_docs_data():
    data = kept()
    for page, path in records.PAGES.items():
        template = (ROOT / "scripts" / "pages" / f"{page}.md").read_text()
        assert render.render(template, data, how=lambda name: results.how(name, data)) == (ROOT / path).read_text()


@pytest.mark.parametrize("page", ["real-model.md", "results.md", "performance.md", "algorithms.md", "scale.md", "planner.md"])
def test_each_results_page_a_reader_opens_is_short(page):
    assert len((ROOT / "docs" / page).read_text().splitlines()) <= 220


def test_the_real_model_page_turns_its_verdict_when_the_planted_figures_do():
    """The page's template on docs/data with the streamed set's async accuracy planted above TRL's."""
    data = copy.deepcopy(kept())
    for run in data["real_paired_stream"]["runs"]:
        systems = run["result"]["systems"]
        systems["async"]["heldout_accuracy"] = systems["trl"]["heldout_accuracy"] + 0.012 * (run["seed"] % 4)
    runs = [r["result"]["systems"] for r in data["real_paired_stream"]["runs"]]
    seeds = [r["seed"] for r in data["real_paired_stream"]["runs"]]
    planted = render.Paired(seeds, [x["async"]["heldout_accuracy"] for x in runs], [x["trl"]["heldout_accuracy"] for x in runs])
    assert round(planted.mean, 3) == 0.018
    template = (ROOT / "scripts" / "pages" / "real-model.md").read_text()
    text = render.render(template, data, how=lambda name: results.how(name, data))
    assert f"| as above, streamed on-policy (staleness 0) | {len(seeds)} |" in text
    row = next(line for line in text.splitlines() if line.startswith("| as above, streamed on-policy"))
    assert f"**{planted.mean:+.3f}** | {planted.sd:.3f} | {planted.se:.3f} | met |" in row
    target = next(line for line in text.splitlines() if "(streamed on-policy) |" in line)
    assert target.endswith(f"| {planted.summary} | met |")
    assert text != (ROOT / "docs" / "real-model.md").read_text()


def test_only_parity_measures_it_keeps_its_json_and_rewrites_its_page(tmp_path, monkeypatch):
    """``results.py --only parity`` with the measurement stubbed: the JSON goes to --work and to the data
    directory, and the pages that read it (results, performance) are written again; the others are left alone."""
    (tmp_path / "docs").mkdir()
    shutil.copytree(ROOT / "scripts" / "pages", tmp_path / "scripts" / "pages")
    shutil.copytree(records.DATA_DIR, tmp_path / "data")
    record = json.loads((records.DATA_DIR / "parity.json").read_text())
    record["result"]["parity"]["async"]["reward_last_10pct"] = [0.9, 0.9, 0.9]
    ran: list[list[str]] = []
    monkeypatch.setattr(results, "ROOT", tmp_path)
    monkeypatch.setattr(results, "DATA_DIR", tmp_path / "data")
    monkeypatch.setattr(results, "run", lambda cmd: ran.append(cmd) or copy.deepcopy(record))
    monkeypatch.setattr(sys, "argv", ["results.py", "--only", "parity", "--work", str(tmp_path / "work")])
    assert results.main() == 0
    assert ran == [results.command(records.BY_NAME["parity"], str(tmp_path / "work"))]
    assert json.loads((tmp_path / "data" / "parity.json").read_text()) == record
    assert json.loads((tmp_path / "work" / "parity.json").read_text()) == record
    page = (tmp_path / "docs" / "results.md").read_text()
    sync0 = record["result"]["parity"]["sync"]["reward_last_10pct"][0]  # whatever the kept measurement's
    assert f"| 0 | 0.900 | {sync0:.3f} | {0.9 - sync0:+.3f} |" in page
    assert (tmp_path / "docs" / "performance.md").exists()  # it cites the parity record's figures too
    assert not (tmp_path / "docs" / "real-model.md").exists()
