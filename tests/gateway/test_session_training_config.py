"""[rollout.gateway] train: a run whose data comes from the gateway, its end, and what it refuses."""

import pytest

from asyncflow.actors.trainer.sources import check_step_shape
from asyncflow.config.load import load_config_text
from asyncflow.core.schema import ConfigError

ON = "[rollout.gateway]\nenabled = true\ntrain = true\n"
STEP = "[train]\nprompts_per_step = 2\n[algorithm]\ngroup_size = 4\n"  # 8 sessions a step


@pytest.mark.timeout(30)
def test_num_sessions_sets_the_runs_steps_and_must_be_whole_steps():
    cfg = load_config_text(STEP + ON + "num_sessions = 40\n")
    assert cfg.train.num_steps == 5
    with pytest.raises(ConfigError, match=r"rollout\.gateway\.num_sessions = 42: .*use a multiple of 8 \(e\.g\. 40\)"):
        load_config_text(STEP + ON + "num_sessions = 42\n")


@pytest.mark.timeout(30)
def test_until_stopped_lifts_the_step_bound_and_excludes_num_sessions():
    cfg = load_config_text(STEP + ON + "until_stopped = true\n")
    assert cfg.train.num_steps >= 1 << 40
    with pytest.raises(ConfigError, match=r"rollout\.gateway\.num_sessions = 8: give num_sessions or until_stopped"):
        load_config_text(STEP + ON + "until_stopped = true\nnum_sessions = 8\n")
    assert load_config_text(STEP + ON).train.num_steps == 60  # the steps of [train], as without the gateway


@pytest.mark.timeout(30)
def test_session_training_needs_the_gateway_and_refuses_what_it_cannot_combine_with():
    with pytest.raises(ConfigError, match=r"rollout\.gateway\.train = True: .*set rollout\.gateway\.enabled = true"):
        load_config_text("[rollout.gateway]\ntrain = true\n")
    with pytest.raises(ConfigError, match=r"rollout\.gateway\.num_sessions = 8: .*set rollout\.gateway\.train = true"):
        load_config_text("[rollout.gateway]\nenabled = true\nnum_sessions = 8\n")
    with pytest.raises(ConfigError, match=r"rollout\.gateway\.train = True: .*set algorithm\.name = 'grpo'"):
        check_step_shape(load_config_text(ON + '[algorithm]\nname = "ppo"\n'))  # the sessions' step source refuses
    with pytest.raises(
        ConfigError,
        match=r"rollout\.gateway\.train = True: .*set rollout\.gateway\.all_replicas = true .*or rollout\.num_replicas = 1",
    ):
        load_config_text("[rollout]\nnum_replicas = 2\n" + ON)
    with pytest.raises(ConfigError, match=r"rollout\.gateway\.reward_timeout_s"):
        load_config_text(ON + "reward_timeout_s = 0\n")


@pytest.mark.timeout(30)
def test_several_replicas_train_on_sessions_when_every_replica_serves_the_gateway():
    cfg = load_config_text("[rollout]\nnum_replicas = 2\n" + ON + "all_replicas = true\n")
    assert (cfg.rollout.num_replicas, cfg.rollout.gateway.all_replicas) == (2, True)
