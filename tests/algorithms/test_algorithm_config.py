"""[algorithm] keys: values checked at load time, with the key and the fix named."""

import logging

import pytest
from tiny_config import tiny_config_text

from asyncflow.config.load import ConfigError, load_config_text


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"epochs": 0}, r"algorithm.epochs = 0: out of range; use a value >= 1"),
    ],
)
def test_a_wrong_algorithm_value_names_the_key_and_the_fix(changes, message):
    with pytest.raises(ConfigError, match=message):
        load_config_text(tiny_config_text({"algorithm": changes}))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"is_truncation": -1.0}, r"algorithm.is_truncation = -1.0: out of range; use a value >= 0"),
        ({"is_mask_low": 1.5}, r"algorithm.is_mask_low = 1.5: out of range; use a value >= 0 and < 1"),
        ({"is_mask_low": -0.1}, r"algorithm.is_mask_low = -0.1"),
        ({"is_mask_high": 0.8}, r"algorithm.is_mask_high = 0.8: use 0 \(no upper bound\) or a ratio above 1"),
        ({"is_level": "row"}, r"algorithm.is_level.*'token', 'sequence'"),
    ],
)
def test_a_wrong_off_policy_correction_names_the_key_and_the_fix(changes, message):
    with pytest.raises(ConfigError, match=message):
        load_config_text(tiny_config_text({"algorithm": changes}))


def test_stale_samples_with_no_correction_at_all_warn_at_load_naming_the_keys(caplog):
    with caplog.at_level(logging.WARNING, logger="asyncflow.config.run"):
        load_config_text(
            tiny_config_text({"algorithm": {"is_truncation": 0.0, "clip_against": "proximal"}, "workflow": {"staleness": 2}})
        )
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    for key in ("workflow.staleness = 2", "algorithm.is_truncation", "algorithm.is_mask_low", "algorithm.clip_against"):
        assert key in record.getMessage()


@pytest.mark.parametrize(
    "changes",
    [
        {"algorithm": {}},  # the default: clipped against the behaviour policy
        {"algorithm": {"clip_against": "proximal"}},  # the default truncated weight
        {"algorithm": {"is_truncation": 0.0, "clip_against": "proximal", "is_mask_high": 2.0}},
        {"algorithm": {"is_truncation": 0.0, "clip_against": "behaviour"}},
        {"algorithm": {"is_truncation": 0.0, "clip_against": "proximal"}, "workflow": {"staleness": 0}},
        {"algorithm": {"is_truncation": 0.0, "clip_against": "proximal"}, "workflow": {"mode": "sync"}},
    ],
)
def test_a_corrected_or_on_policy_run_loads_without_a_warning(changes, caplog):
    with caplog.at_level(logging.WARNING, logger="asyncflow.config.run"):
        load_config_text(tiny_config_text(changes))
    assert caplog.records == []
