"""``model.path`` as a Hugging Face hub id (``org/name``): resolved once, as the config is
loaded in the driver, to the snapshot directory of huggingface_hub's cache (HF_HUB_CACHE,
HF_HOME), downloaded there when the machine is online; offline and not cached, refused
naming the id and the command that fetches it. Nothing here reaches the network: the
cache is built by hand, and the one download is a stand-in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import Qwen3Config

from asyncflow.config.load import ConfigError, load_config
from asyncflow.toy.tiny import build_char_tokenizer

REPO = "Qwen/Qwen3-0.6B"
COMMIT = "c1899de289a04d12100db370d81485cdf75e47ca"


def tiny_model(out: Path) -> Path:
    """A model directory's files (config.json, tokenizer) without weights: loading a config reads no weights."""
    Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, head_dim=32).save_pretrained(
        out
    )
    build_char_tokenizer().save_pretrained(out)
    return out


def cache_model(cache: Path, repo_id: str = REPO, commit: str = COMMIT) -> Path:
    """``repo_id`` in a hub cache laid out as huggingface_hub lays it out; returns its snapshot."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = tiny_model(repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def offline(monkeypatch, tmp_path) -> Path:
    """An empty hub cache of this test's own, and no network (HF_HUB_OFFLINE=1)."""
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def config_file(tmp_path: Path, text: str) -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    path = run / "cluster.toml"
    path.write_text(text)
    return path


@pytest.mark.timeout(60)
def test_a_hub_id_in_the_cache_resolves_to_its_snapshot_directory(offline, tmp_path):
    snapshot = cache_model(offline)
    cfg = load_config(config_file(tmp_path, f'[model]\npath = "{REPO}"\n'))
    assert Path(cfg.model.path) == snapshot
    # given on the command line too
    cfg = load_config(config_file(tmp_path, ""), [f"model.path={REPO}"])
    assert Path(cfg.model.path) == snapshot


@pytest.mark.timeout(60)
def test_the_cache_is_found_under_hf_home_when_hf_hub_cache_is_unset(offline, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    snapshot = cache_model(tmp_path / "hf-home" / "hub")
    assert Path(load_config(config_file(tmp_path, f'[model]\npath = "{REPO}"\n')).model.path) == snapshot


@pytest.mark.timeout(60)
def test_an_uncached_hub_id_offline_is_refused_naming_the_id_and_the_command_that_fetches_it(offline, tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(config_file(tmp_path, f'[model]\npath = "{REPO}"\n'))
    message = str(err.value)
    assert message.startswith(f"model.path = '{REPO}'")
    assert f"hf download {REPO}" in message and "HF_HUB_OFFLINE" in message and str(offline) in message


@pytest.mark.timeout(60)
def test_a_local_directory_of_the_same_shape_as_a_hub_id_wins_over_the_hub(offline, tmp_path):
    cache_model(offline)
    local = tiny_model(tmp_path / "run" / "Qwen" / "Qwen3-0.6B")  # relative to the config file
    assert Path(load_config(config_file(tmp_path, f'[model]\npath = "{REPO}"\n')).model.path) == local


@pytest.mark.timeout(60)
def test_a_path_that_is_no_hub_id_is_still_refused_as_a_missing_directory(offline, tmp_path):
    with pytest.raises(ConfigError, match=r"model.path = '.*no/such/model': no such directory"):
        load_config(config_file(tmp_path, '[model]\npath = "./no/such/model"\n'))


@pytest.mark.timeout(60)
def test_online_an_uncached_hub_id_is_downloaded_into_the_cache_once_as_the_config_loads(tmp_path, monkeypatch):
    import huggingface_hub

    cache = tmp_path / "hub-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    real = huggingface_hub.snapshot_download
    calls = []

    def download(repo_id, **kw):  # the hub, played by a local copy: the network is never reached
        calls.append(kw.get("local_files_only", False))
        if kw.get("local_files_only"):
            return real(repo_id, **kw)
        assert kw["cache_dir"] == str(cache) and "*.safetensors" in kw["allow_patterns"]
        snapshot = cache_model(Path(kw["cache_dir"]), repo_id)
        (snapshot / "model.safetensors").write_bytes(b"")  # the weights' file (never read here)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    cfg = load_config(config_file(tmp_path, f'[model]\npath = "{REPO}"\n'))
    assert Path(cfg.model.path) == cache / "models--Qwen--Qwen3-0.6B" / "snapshots" / COMMIT
    assert calls == [True, False]  # the cache first, then the download
    load_config(config_file(tmp_path, f'[model]\npath = "{REPO}"\n'))
    assert calls == [True, False, True]  # cached now: no second download


@pytest.mark.timeout(60)
def test_every_role_gets_the_resolved_directory_from_the_runs_config_and_launch_plan(offline, tmp_path):
    from asyncflow.actors.driver.prepare import prepare_new

    snapshot = cache_model(offline)
    cfg = load_config(config_file(tmp_path, f'[model]\npath = "{REPO}"\n[data]\nchat_template = true\nnum_prompts = 20\n'))
    _, rd, launch = prepare_new(cfg, tmp_path / "out")
    assert Path(launch.model_dir) == snapshot and Path(launch.base_model_dir) == snapshot
    saved = json.loads((rd / "config.json").read_text())
    assert Path(saved["model"]["path"]) == snapshot


@pytest.mark.timeout(60)
def test_a_failed_download_is_refused_naming_the_id_why_and_the_command(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    real = huggingface_hub.snapshot_download

    def download(repo_id, **kw):  # a machine that cannot reach the hub
        if kw.get("local_files_only"):
            return real(repo_id, **kw)
        raise OSError("Network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    with pytest.raises(ConfigError) as err:
        load_config(config_file(tmp_path, '[reward_model]\nenabled = true\nkind = "judge"\npath = "org/judge-model"\n'))
    message = str(err.value)
    assert message.startswith("reward_model.path = 'org/judge-model'")
    assert "Network is unreachable" in message and "hf download org/judge-model" in message
