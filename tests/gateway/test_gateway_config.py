"""[rollout.gateway]: typed, validated; off loopback it needs the cluster secret."""

import pytest

from asyncflow.config.load import load_config_text
from asyncflow.core.schema import ConfigError


def test_the_gateway_is_off_by_default_and_on_loopback():
    gw = load_config_text("").rollout.gateway
    assert (gw.enabled, gw.host, gw.require_secret) == (False, "127.0.0.1", False)


def test_a_gateway_off_loopback_without_the_cluster_secret_is_refused_naming_the_key_and_the_fix(monkeypatch):
    monkeypatch.delenv("ASYNCFLOW_SECRET", raising=False)
    with pytest.raises(ConfigError, match=r"rollout\.gateway\.host = '0\.0\.0\.0': .*ASYNCFLOW_SECRET.*127\.0\.0\.1"):
        load_config_text('[rollout.gateway]\nenabled = true\nhost = "0.0.0.0"')
    with pytest.raises(ConfigError, match=r"rollout\.gateway\.require_secret = True"):
        load_config_text("[rollout.gateway]\nenabled = true\nrequire_secret = true")
    monkeypatch.setenv("ASYNCFLOW_SECRET", "x" * 32)
    assert load_config_text('[rollout.gateway]\nenabled = true\nhost = "0.0.0.0"').rollout.gateway.host == "0.0.0.0"


def test_the_gateway_replica_must_exist_and_the_port_be_a_port():
    with pytest.raises(ConfigError, match=r"rollout\.gateway\.replica = 2: there are 2 rollout replicas"):
        load_config_text("[rollout]\nnum_replicas = 2\n[rollout.gateway]\nenabled = true\nreplica = 2")
    with pytest.raises(ConfigError, match=r"rollout\.gateway\.port"):
        load_config_text("[rollout.gateway]\nport = 70000")


def test_a_resumed_run_may_turn_the_gateway_on_but_not_change_the_rollout():
    from asyncflow.config.resumable import apply_resume_overrides

    cfg = load_config_text("")
    resumed = apply_resume_overrides(cfg, ["rollout.gateway.enabled=true", "rollout.gateway.port=0"])
    assert (resumed.rollout.gateway.enabled, resumed.rollout.gateway.port) == (True, 0)
    with pytest.raises(ConfigError, match="--set rollout.num_replicas: cannot change when resuming"):
        apply_resume_overrides(cfg, ["rollout.num_replicas=2"])


def test_a_bracketed_ipv6_host_is_refused_before_the_run_starts():
    with pytest.raises(ConfigError, match=r"rollout\.gateway\.host = '\[::1\]': give the address without brackets \('::1'\)"):
        load_config_text('[rollout.gateway]\nenabled = true\nhost = "[::1]"')
    assert load_config_text('[rollout.gateway]\nenabled = true\nhost = "::1"').rollout.gateway.host == "::1"


def test_the_driver_prints_where_the_gateway_answers_and_for_how_long(tmp_path):
    import json

    from tiny_config import tiny_config_text

    from asyncflow.actors.driver.launcher import gateway_line
    from asyncflow.config.load import load_config_text

    on = load_config_text(tiny_config_text({"rollout.gateway": {"enabled": True}, "train": {"num_steps": 300}}))
    assert "not in RUN_DIR/gateway.json yet" in gateway_line(tmp_path, on)
    url = "http://127.0.0.1:41234"
    (tmp_path / "gateway.json").write_text(json.dumps({"url": url, "replica": 0, "trajectories": "t.jsonl"}))
    line = gateway_line(tmp_path, on)
    assert f"{url}/v1" in line and "rollout.0" in line and "300 steps" in line
    assert gateway_line(tmp_path, load_config_text(tiny_config_text())) == ""


def test_sessions_move_from_a_gone_replica_after_a_grace_longer_than_the_supervisors_restart_backoff():
    replicas = "[rollout]\nnum_replicas = 2\n[rollout.gateway]\nenabled = true\nall_replicas = true\n"
    assert load_config_text(replicas).rollout.gateway.session_move_after_s == 300.0
    assert load_config_text(replicas + "session_move_after_s = 5.0").rollout.gateway.session_move_after_s == 5.0
    with pytest.raises(
        ConfigError, match=r"rollout\.gateway\.session_move_after_s = 0\.5: .*cluster\.restart_backoff_s = 1.*raise it above 1"
    ):
        load_config_text(replicas + "session_move_after_s = 0.5")
    with pytest.raises(ConfigError, match=r"rollout\.gateway\.session_move_after_s"):
        load_config_text(replicas + "session_move_after_s = -1.0")
