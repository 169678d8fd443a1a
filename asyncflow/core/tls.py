"""TLS for tcp: a per-cluster CA and the certificate every process of the cluster shows.

``afctl certs DIR`` (``make_cluster_certs``) writes into DIR:

    ca.pem     the cluster's CA certificate (the only trust anchor of its processes)
    ca.key     the CA's private key, mode 0600 (needed only to issue certificates again;
               keep it off the nodes)
    node.pem   the certificate every process of the cluster shows, signed by the CA
    node.key   its private key, mode 0600

With ``[cluster.transport] tls_dir = DIR`` tcp listeners and dialers use
``tls+tcp://`` with mutual authentication: a peer without a certificate of this CA
fails the handshake, before nng hands any of its bytes to a listener. A frame
captured on the wire is ciphertext under that connection's keys: replayed on
another connection it decodes to nothing. Every certificate names the host
``asyncflow`` (``SERVER_NAME``): the CA, not the node's address, is what is checked.
"""

from __future__ import annotations

import datetime
import functools
import os
from pathlib import Path

import pynng

from asyncflow.core.private_files import write_private

SERVER_NAME = "asyncflow"
FILES = ("ca.pem", "node.pem", "node.key")


def make_cluster_certs(directory: str | os.PathLike, days: int = 365) -> Path:
    """A new CA and node certificate in ``directory`` (made 0700 when new); returns it."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        raise RuntimeError(
            "afctl certs needs the cryptography package: pip install -e '.[tls]' (in the asyncflow checkout)"
        ) from None
    out = Path(directory)
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    def name(cn: str):
        return x509.Name(
            [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "asyncflow"), x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("asyncflow cluster CA"))
        .issuer_name(name("asyncflow cluster CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    node_key = ec.generate_private_key(ec.SECP256R1())
    node = (
        x509.CertificateBuilder()
        .subject_name(name(SERVER_NAME))
        .issuer_name(ca.subject)
        .public_key(node_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def key_pem(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    write_private(out / "ca.key", key_pem(ca_key))
    write_private(out / "node.key", key_pem(node_key))
    (out / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (out / "node.pem").write_bytes(node.public_bytes(serialization.Encoding.PEM))
    return out


@functools.cache
def tls_config(directory: str, server: bool) -> pynng.TLSConfig:
    """The TLSConfig of a listener (``server``) or a dialer, from a directory of
    ``afctl certs``; mutual authentication either way."""
    path = Path(directory)
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise ValueError(
            f"[cluster.transport] tls_dir = {directory!r} lacks {', '.join(missing)}: "
            f"make it with `afctl certs {directory}` and copy it to every node"
        )
    mode = (path / "node.key").stat().st_mode & 0o077
    if mode:
        raise PermissionError(
            f"[cluster.transport] tls_dir: {path / 'node.key'} is readable by other users: `chmod 600 {path / 'node.key'}`"
        )
    return pynng.TLSConfig(
        pynng.TLSConfig.MODE_SERVER if server else pynng.TLSConfig.MODE_CLIENT,
        server_name=None if server else SERVER_NAME,
        ca_string=(path / "ca.pem").read_text(),
        own_cert_string=(path / "node.pem").read_text(),
        own_key_string=(path / "node.key").read_text(),
        auth_mode=pynng.TLSConfig.AUTH_MODE_REQUIRED,
    )
