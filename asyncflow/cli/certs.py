"""``afctl certs DIR``: a per-cluster CA and node certificate for TLS between actors.

Copy DIR (without ca.key) to every node and set ``[cluster.transport] tls_dir = DIR``
with ``scheme = "tcp"``. See docs/security.md."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--days", default=365, show_default=True, help="Validity of the certificates.")
@click.option("--force", is_flag=True, help="Replace the certificates already in DIRECTORY.")
def certs(directory: Path, days: int, force: bool) -> None:
    """Make a cluster CA and the certificate every process shows (mutual TLS)."""
    from asyncflow.core.tls import make_cluster_certs

    if (directory / "ca.pem").exists() and not force:
        raise click.ClickException(
            f"{directory} already holds certificates: pass --force to replace them (every node must then get the new ones)"
        )
    try:
        out = make_cluster_certs(directory, days=days)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"wrote {out}/ca.pem, node.pem, node.key (0600) and ca.key (0600; keep it off the nodes).\n"
        f"Copy {out} without ca.key to every node and set in the cluster config:\n"
        f'  [cluster.transport]\n  scheme = "tcp"\n  tls_dir = "{out.resolve()}"'
    )
