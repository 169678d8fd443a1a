"""A whole run over tls+tcp: every process (hosts started by the driver included)
dials and listens with the cluster's certificates from ``afctl certs``."""

from __future__ import annotations

import json

import pytest
from wf_helpers import afctl, write_config


@pytest.mark.slow  # 16 s: -m slow (the default suite stays under 10 minutes); tests/core/test_security.py covers TLS actors
@pytest.mark.timeout(200)
def test_a_run_over_tls_with_certificates_from_afctl_certs_trains_every_step(tmp_path):
    pytest.importorskip("cryptography")
    certs = tmp_path / "certs"
    made = afctl("certs", str(certs))
    assert made.wait(timeout=60) == 0, made.stdout.read()
    config = write_config(
        tmp_path,
        num_steps=3,
        extra=f"""
[cluster.transport]
scheme = "tcp"
tls_dir = "{certs}"
""",
    )
    proc = afctl("up", str(config), "--run-dir", str(tmp_path / "run"))
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert "done: 3 steps" in out
    addresses = json.dumps(json.loads((tmp_path / "run" / "cluster.json").read_text()))
    assert "tls+tcp://" in addresses and "ipc://" not in addresses
