"""Every device a config names is checked before any process starts: each role's spec
says which keys its instances run on (``RoleSpec.devices_used``)."""

from __future__ import annotations

import pytest
from tiny_config import tiny_config_text

from asyncflow.actors.driver.prepare import prepare_new
from asyncflow.config.load import ConfigError, load_config_text

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"reward_model": {"enabled": True, "device": "cuda"}}, "reward_model.device"),
        ({"rollout.engine": {"device": "cuda"}}, "rollout.engine.device"),
        ({"algorithm": {"name": "ppo"}, "critic.engine": {"device": "cuda"}}, "critic.engine.device"),
    ],
)
def test_a_device_this_machine_lacks_is_refused_by_its_key_before_the_run_starts(tmp_path, changes, key):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cfg = load_config_text(tiny_config_text(changes))
    with pytest.raises(ConfigError, match=rf"{key} = 'cuda', but torch sees no CUDA device"):
        prepare_new(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before the run directory is made


def test_a_role_that_does_not_run_is_not_checked(tmp_path):
    cfg = load_config_text(tiny_config_text({"reward_model": {"enabled": False, "device": "cuda"}}))
    prepare_new(cfg, tmp_path / "run")  # no reward-model process: its device is never used
