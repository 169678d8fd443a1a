"""[algorithm] keys: values checked at load time, with the key and the fix named."""

import pytest
from tiny_config import tiny_config_text

from asyncflow.core.config import ConfigError, load_config_text


@pytest.mark.parametrize("changes, message", [
    ({"epochs": 0}, "algorithm.epochs = 0: use 1 or more"),
])
def test_a_wrong_algorithm_value_names_the_key_and_the_fix(changes, message):
    with pytest.raises(ConfigError, match=message):
        load_config_text(tiny_config_text({"algorithm": changes}))
