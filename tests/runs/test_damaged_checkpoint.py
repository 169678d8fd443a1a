"""Resume past a damaged checkpoint and a torn audit line."""

from __future__ import annotations

import json

import pytest
from wf_helpers import afctl, assert_trained_exactly_once, read_jsonl, write_config


@pytest.mark.timeout(300)
def test_a_truncated_latest_checkpoint_is_named_and_resume_falls_back_to_the_previous_one(tmp_path):
    run_dir = tmp_path / "run"
    first = afctl("up", str(write_config(tmp_path, num_steps=4, checkpoint_every=2)), "--run-dir", str(run_dir))
    out, _ = first.communicate(timeout=200)
    assert first.returncode == 0, out
    ckpts = run_dir / "checkpoints"
    assert (ckpts / "step_000002" / "MANIFEST.json").exists() and (ckpts / "step_000004" / "MANIFEST.json").exists()
    weights = ckpts / "step_000004" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a torn write
    (ckpts / "step_000002" / "MANIFEST.json").unlink()  # deleted by hand: the fallback is used, but not silently
    trained = run_dir / "trained.jsonl"
    trained.write_text(trained.read_text() + '{"step": 4, "groups": [1, 2')  # a driver killed mid-line
    config = json.loads((run_dir / "config.json").read_text())
    config["train"]["num_steps"] = 6
    (run_dir / "config.json").write_text(json.dumps(config))
    second = afctl("up", "--resume", str(run_dir))
    out, _ = second.communicate(timeout=200)
    assert second.returncode == 0, out
    assert "checkpoint step_000004 is damaged: model/model.safetensors" in out, out
    assert "trained.jsonl: dropped a torn last line" in out, out
    assert "resuming from" in out and "step_000002" in out, out
    assert "checkpoint step_000002 has no MANIFEST.json: resuming from it unchecked" in out, out
    assert [int(m["step"]) for m in read_jsonl(run_dir / "metrics.jsonl")] == list(range(6))
    assert_trained_exactly_once(run_dir, 6, 2, 2)


@pytest.mark.timeout(10)
def test_the_manifest_names_a_flipped_a_truncated_and_a_missing_file(tmp_path):
    from asyncflow.actors.trainer.manifest import damage, write_manifest

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w.bin").write_bytes(b"\x00" * 100)
    (tmp_path / "roles.msgpack").write_bytes(b"\x80")
    assert damage(tmp_path) is None  # no manifest: taken as it is (saved before manifests)
    write_manifest(tmp_path)
    (tmp_path / "DONE").write_text("2\n")  # written after the manifest, not listed
    assert damage(tmp_path) is None
    (tmp_path / "model" / "w.bin").write_bytes(b"\x00" * 99 + b"\x01")
    assert damage(tmp_path) == "model/w.bin: sha256 differs from the manifest"
    (tmp_path / "model" / "w.bin").write_bytes(b"\x00" * 10)
    assert damage(tmp_path) == "model/w.bin: 10 bytes, the manifest says 100"
    (tmp_path / "model" / "w.bin").unlink()
    assert damage(tmp_path) == "model/w.bin: missing"
