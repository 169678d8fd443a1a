"""The device lists moved from ``[cluster]`` into each role's own section (``devices``): the
old keys are still read, with a warning that names the old key and the new one; both at
once are refused naming both; the shipped examples use the new keys."""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import pytest
import tomllib

from asyncflow.config.cluster import MOVED_DEVICES
from asyncflow.config.load import ConfigError, load_config_text
from asyncflow.config.run import RunConfig

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
ONE_EACH = "[algorithm]\nkl_coef = 0.1\n[reward_model]\nenabled = true\n"
"""A config that starts one instance of every role with devices (the reference needs a KL term)."""


@pytest.mark.parametrize("old,section", MOVED_DEVICES.items())
def test_an_old_cluster_device_key_is_read_into_its_roles_section_with_a_warning_naming_both(old, section, caplog):
    with caplog.at_level(logging.WARNING):
        cfg = load_config_text(f"{ONE_EACH}[cluster]\n{old} = [3]\n")
    assert getattr(cfg, section).devices == [3] and getattr(cfg.cluster, old) == []
    assert f"[cluster] {old} is deprecated: write [{section}] devices = [3]" in caplog.text


@pytest.mark.parametrize("old,section", MOVED_DEVICES.items())
def test_an_old_cluster_device_key_and_its_new_key_together_are_refused_naming_both(old, section):
    with pytest.raises(ConfigError) as info:
        load_config_text(ONE_EACH, overrides=[f"cluster.{old}=[3]", f"{section}.devices=[4]"])
    assert str(info.value) == (
        f"cluster.{old} = [3]: is deprecated and {section}.devices is given too: keep only [{section}] devices "
        f"(and remove [cluster] {old})"
    )


def test_a_saved_config_with_the_old_keys_still_decodes_into_the_new_ones(caplog):
    """A run directory's config.json written before the move (resume reads it back)."""
    old = msgspec.json.decode(
        msgspec.json.encode({"cluster": {"rollout_devices": [1], "train_devices": [0], "reference_devices": []}}),
        type=RunConfig,
    )
    assert (old.rollout.devices, old.train.devices, old.reference.devices) == ([1], [0], [])
    again = msgspec.json.decode(msgspec.json.encode(old), type=RunConfig)  # the config.json the run writes now
    assert (again.rollout.devices, again.train.devices) == ([1], [0]) and again.cluster.rollout_devices == []


def test_no_example_config_uses_a_deprecated_key():
    examples = {path.name: tomllib.loads(path.read_text()) for path in sorted((ROOT / "examples").glob("*.toml"))}
    moved = [
        f"{name}: [cluster] {key}" for name, raw in examples.items() for key in raw.get("cluster", {}) if key in MOVED_DEVICES
    ]
    assert moved == []


def test_a_roles_devices_cannot_change_on_resume_because_the_processes_are_laid_out_from_them():
    from asyncflow.config.resumable import apply_resume_overrides

    with pytest.raises(ConfigError, match=r"--set train.devices: cannot change when resuming \(the run's processes"):
        apply_resume_overrides(RunConfig(), ["train.devices=[1]"])
