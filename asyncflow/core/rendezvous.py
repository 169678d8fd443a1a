"""torch.distributed rendezvous through the directory.

torch.distributed needs every member of a group to know one ``host:port`` (the
TCPStore of rank 0) before it starts. We do not configure that address by hand:
the member that owns the group (rank 0) starts a TCPStore on its node's own
address, on a port the OS picks (or ``port``), and registers it in the directory
as ``dist.<group>``; the other members look it up (waiting for it to appear) and
connect. Works the same on one machine, across network namespaces and across
Ray nodes, because the node's address is the one its actors already advertise.

The store carries no secret (as with torchrun): the port must be reachable only
inside the cluster (docs/multi-node.md, "Ports").

Two uses:
- :func:`init_default_group`: the trainer ranks' default process group (FSDP2).
- :func:`host_store` / :func:`join_store` + a standalone group built by the
  caller on that store (the device-collective weight channel).
"""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist

from asyncflow.core import protocol
from asyncflow.core.transport import _WILDCARD, TransportConfig

PREFIX = "dist."
STORE_KIND = "torch.distributed.TCPStore"


def entry_name(group: str) -> str:
    return PREFIX + group


def node_host(transport: TransportConfig) -> str:
    """The address other nodes reach this process at: the one its actors advertise
    (tcp), else loopback (ipc/inproc: everything is on this machine)."""
    if transport.scheme == "tcp":
        if transport.advertise_host not in _WILDCARD:
            return transport.advertise_host
        if transport.bind_host not in _WILDCARD:
            return transport.bind_host
    return "127.0.0.1"


def interface_of(address: str) -> str | None:
    """The name of this machine's network interface that holds IPv4 ``address``."""
    import fcntl
    import socket
    import struct

    SIOCGIFADDR = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on it
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def pin_interface(transport: TransportConfig) -> None:
    """Make gloo, NCCL and HCCL's socket bootstrap use the interface of this node's
    advertised address (they otherwise pick the one the hostname resolves to, which
    on multi-homed nodes may be unreachable from the peers). A value the user set
    in the environment wins."""
    host = node_host(transport)
    if host.startswith("127."):
        return
    name = interface_of(host)
    if name is None:
        return
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME"):
        os.environ.setdefault(var, name)


def host_store(
    directory, group: str, transport: TransportConfig, world_size: int, timeout_s: float, port: int = 0
) -> dist.TCPStore:
    """Start the group's TCPStore here (rank 0) and publish its address as ``dist.<group>``."""
    host = node_host(transport)
    try:
        store = dist.TCPStore(host, port, world_size, True, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    except (RuntimeError, OSError) as exc:  # DistNetworkError is a RuntimeError
        raise RuntimeError(
            f"could not start the torch.distributed store of group {group!r} on {host}:{port or 'any port'} ({exc}); "
            f"choose another port (train.dist_port) or check that {host} is this node's address"
        ) from exc
    directory.register(
        protocol.ActorEntry(
            name=entry_name(group),
            address=f"tcp://{host}:{store.port}",
            host=os.uname().nodename,
            pid=os.getpid(),
            kind=STORE_KIND,
        )
    )
    return store


def join_store(directory, group: str, world_size: int, timeout_s: float) -> dist.TCPStore:
    """Connect to the TCPStore that rank 0 of ``group`` published (waits up to ``timeout_s``)."""
    try:
        entry = directory.lookup(entry_name(group), wait_s=timeout_s)
    except LookupError:
        raise TimeoutError(
            f"rank 0 of group {group!r} did not publish its torch.distributed store within {timeout_s:.0f} s "
            f"(no {entry_name(group)!r} in the directory): is its process up?"
        ) from None
    host, _, port = entry.address.removeprefix("tcp://").rpartition(":")
    try:
        return dist.TCPStore(host, int(port), world_size, False, timeout=datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, OSError) as exc:
        raise RuntimeError(
            f"could not reach the torch.distributed store of group {group!r} at {host}:{port} ({exc}): "
            f"open that port between the nodes, or set train.dist_port to one that is open"
        ) from exc


def init_default_group(
    directory, group: str, transport: TransportConfig, rank: int, world_size: int, backend: str, timeout_s: float, port: int = 0
) -> dist.TCPStore:
    """Initialise this process's default process group as ``rank`` of ``world_size``
    (rank 0 publishes the store, the others find it). Returns the store (keep it alive)."""
    pin_interface(transport)
    if rank == 0:
        store = host_store(directory, group, transport, world_size, timeout_s, port)
    else:
        store = join_store(directory, group, world_size, timeout_s)
    dist.init_process_group(
        backend=backend, store=store, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s)
    )
    return store
