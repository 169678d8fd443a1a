"""nng sockets with the security baseline: bounded sizes, timeouts, loopback by default.

- Every socket has ``recv_max_size`` set (a bound protects a listener from a
  hostile or broken peer) and timeouts.
- Listeners bind ipc or loopback tcp unless ``bind_host`` says otherwise; binding
  a non-loopback address without a cluster secret is refused.
- The address a tcp listener registers is the one peers can dial: ``bind_host``
  itself, or ``advertise_host`` when ``bind_host`` is a wildcard (``0.0.0.0``).
- With ``tls_dir`` tcp is ``tls+tcp://`` with mutual authentication (``core/tls.py``).
- tcp requests must carry the cluster secret (``secret`` here, or the environment
  variable ``ASYNCFLOW_SECRET``); ipc/inproc peers are trusted by the filesystem:
  the ipc directory must belong to this user and be writable by no one else
  (``ipc_dir`` refuses it otherwise).
"""

from __future__ import annotations

import itertools
import os
import random
import re
import stat
import tempfile
import threading
import uuid
from collections.abc import Collection
from typing import Annotated

import msgspec
import pynng
from msgspec import Meta

from asyncflow.core.protocol import MAX_WAIT_S

SECRET_ENV = "ASYNCFLOW_SECRET"
TRANSPORT_ENV = "ASYNCFLOW_TRANSPORT"
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
_WILDCARD = {"0.0.0.0", "::", "[::]", ""}


def is_loopback(host: str) -> bool:
    """Whether ``bind_host`` keeps every listener on this machine's loopback."""
    return host in _LOOPBACK


class TransportConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How actors talk. ``scheme``: ``inproc`` (one process), ``ipc`` (one host),
    ``tcp`` (several hosts)."""

    scheme: Annotated[
        str,
        Meta(
            description="``inproc`` (every actor in one process: tests), ``ipc`` (one host: unix sockets in ``ipc_dir``) or ``tcp`` "
            "(several hosts)."
        ),
    ] = "ipc"
    bind_host: Annotated[
        str,
        Meta(
            description="tcp: the address listeners bind. Loopback by default; any other address needs ``secret`` or ``tls_dir`` "
            "(docs/security.md), and a wildcard (``0.0.0.0``) needs ``advertise_host``."
        ),
    ] = "127.0.0.1"
    secret: Annotated[
        str,
        Meta(
            description="tcp without ``tls_dir``: the cluster secret every frame carries and every tcp listener checks (it travels in "
            "clear text: see docs/security.md). Prefer the ASYNCFLOW_SECRET environment variable; one set here is written "
            "to RUN_DIR/secret (mode 0600), never to RUN_DIR/config.json."
        ),
    ] = ""
    max_message_bytes: Annotated[
        int,
        Meta(
            gt=0,
            description="The largest frame an actor listener accepts (nng drops a bigger one): bounds weight chunks and queue "
            "batches.",
        ),
    ] = 2 << 30
    ipc_dir: Annotated[
        str,
        Meta(
            description="ipc: the directory of the sockets (empty: a fresh one per run, or TMPDIR/asyncflow-UID). It must belong to "
            "this user and be writable by no one else, and its path leave room for a socket's name in the 107 bytes "
            "a Unix socket path may have (a path too long for any is refused)."
        ),
    ] = ""
    connect_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            le=MAX_WAIT_S,
            description="Seconds to wait when dialing a peer and for the directory's answers (register, look up) before failing.",
        ),
    ] = 10.0
    ask_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            le=MAX_WAIT_S,
            description="How long one attempt of a request waits for its answer (on top of the time the peer may hold it on "
            "purpose, such as a queue get's poll) before it is sent again. A peer that does not answer is frozen or dead; "
            "the queue's requests and notices are resent, with the same request id, so the peer serves each once when it "
            "wakes (docs/faults.md, 'Freeze policy').",
        ),
    ] = 30.0
    freeze_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            le=MAX_WAIT_S,
            description="How long a request is resent to a peer that does not answer before it fails with ``PeerFrozen``; and "
            "how long a process of the run may stay frozen (stopped, in a debugger, swapped out) before the driver kills it "
            "and restarts it in place like a dead one (a process that cannot be restarted alone stops the run, which "
            "``cluster.max_resumes`` resumes). At least ``ask_timeout_s``.",
        ),
    ] = 600.0
    advertise_host: Annotated[
        str,
        Meta(
            description="tcp with a wildcard ``bind_host``: the node's own address, registered in the directory so that peers on other "
            "nodes can dial it (launcher = ray sets it)."
        ),
    ] = ""
    tls_dir: Annotated[
        str,
        Meta(
            description="tcp: a directory made by `afctl certs DIR` (ca.pem, node.pem, node.key), present on every node. When set, tcp "
            "listeners and dialers use TLS (``tls+tcp://``) with mutual authentication against this cluster's CA: frames "
            "are encrypted, a captured frame cannot be replayed, and a peer without the cluster's certificate cannot send "
            "a byte to a listener. See docs/security.md."
        ),
    ] = ""
    control_max_message_bytes: Annotated[
        int,
        Meta(
            gt=0,
            description="The largest frame the control listeners (directory, process hosts) accept; other listeners accept "
            "``max_message_bytes``. nng buffers a whole frame before the listener sees it, so this bounds what an "
            "unauthenticated peer makes them hold.",
        ),
    ] = 16 << 20
    ports: Annotated[
        str,
        Meta(
            description='tcp: the range ``"MIN-MAX"`` of ports listeners take, one per actor (to open in a firewall); empty: any free '
            "port."
        ),
    ] = ""

    def port_range(self) -> tuple[int, int] | None:
        if not self.ports:
            return None
        low, sep, high = self.ports.partition("-")
        if not (sep and low.isdigit() and high.isdigit() and 0 < int(low) <= int(high) < 65536):
            raise ValueError(f"[cluster.transport] ports = {self.ports!r}: write a range such as '41000-41999'")
        return int(low), int(high)

    def secret_bytes(self) -> bytes:
        return (self.secret or os.environ.get(SECRET_ENV, "")).encode()

    def validate(self) -> TransportConfig:
        if self.scheme not in ("inproc", "ipc", "tcp"):
            raise ValueError(f"[cluster.transport] scheme = {self.scheme!r}: use 'inproc', 'ipc' or 'tcp'")
        if self.scheme == "tcp" and self.bind_host not in _LOOPBACK and not (self.secret_bytes() or self.tls_dir):
            raise ValueError(
                f"[cluster.transport] bind_host = {self.bind_host!r} is not loopback: set "
                f"[cluster.transport] tls_dir (from `afctl certs DIR`), or a secret "
                f"([cluster.transport] secret or the {SECRET_ENV} environment variable)"
            )
        self.port_range()
        if self.max_message_bytes <= 0:
            raise ValueError("[cluster.transport] max_message_bytes must be > 0")
        if self.control_max_message_bytes <= 0:
            raise ValueError("[cluster.transport] control_max_message_bytes must be > 0")
        if self.freeze_timeout_s < self.ask_timeout_s:
            raise ValueError(
                f"[cluster.transport] freeze_timeout_s = {self.freeze_timeout_s:g} is shorter than ask_timeout_s = "
                f"{self.ask_timeout_s:g}: a request is resent for freeze_timeout_s, so make it at least ask_timeout_s"
            )
        if self.tls_dir and self.scheme != "tcp":
            raise ValueError(
                f"[cluster.transport] tls_dir is set but scheme = {self.scheme!r}: TLS is for tcp; "
                f"set scheme = 'tcp' or remove tls_dir"
            )
        return self

    def to_env(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def from_env(cls) -> TransportConfig:
        raw = os.environ.get(TRANSPORT_ENV)
        return msgspec.json.decode(raw, type=cls) if raw else cls()


_counter = itertools.count()
_ipc_lock = threading.Lock()
# a Unix socket's path holds at most 107 bytes (sun_path less its NUL); nng answers a longer one with a
# bare "Address invalid" when the actor binds
IPC_PATH_MAX = 107


def ipc_dir(config: TransportConfig) -> str:
    """The directory of this process's ipc sockets: made private (0700) when new, and
    refused when another user owns it or others may write to it (they could replace
    a socket with their own and receive our frames)."""
    with _ipc_lock:
        path = config.ipc_dir or os.path.join(tempfile.gettempdir(), f"asyncflow-{os.getuid()}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        check_private_dir(path)
        return path


def check_private_dir(path: str) -> None:
    st = os.stat(path)
    key = "[cluster.transport] ipc_dir"
    if st.st_uid != os.getuid():
        raise PermissionError(
            f"{key}: the ipc directory {path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()}): "
            f"set ipc_dir to a directory of your own (mode 0700), or remove {path}"
        )
    if st.st_mode & 0o022:
        raise PermissionError(
            f"{key}: the ipc directory {path} has mode {stat.S_IMODE(st.st_mode):04o}, writable by other users: "
            f"`chmod 700 {path}`, or set ipc_dir to a private directory"
        )


def new_address(config: TransportConfig, name: str) -> str:
    """A fresh listen address for an actor named ``name`` (tcp: port 0, resolved on bind)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    if config.scheme == "inproc":
        return f"inproc://{safe}-{uuid.uuid4().hex[:8]}"
    if config.scheme == "ipc":
        return f"ipc://{_ipc_path(ipc_dir(config), safe)}"
    return f"{_tcp_scheme(config)}://{url_host(config.bind_host)}:0"


def _ipc_path(folder: str, name: str) -> str:
    """A fresh socket path in ``folder``: ``<name>-<pid>-<n>.sock``, or ``<pid>-<n>.sock`` where the
    name would pass :data:`IPC_PATH_MAX` (the name only helps a person reading the directory)."""
    unique = f"{os.getpid()}-{next(_counter)}.sock"
    for path in (f"{folder}/{name}-{unique}", f"{folder}/{unique}"):
        if len(path.encode()) <= IPC_PATH_MAX:
            return path
    raise ValueError(
        f"[cluster.transport] ipc_dir = {folder!r} is too long for a Unix socket: a socket's path holds at most "
        f"{IPC_PATH_MAX} bytes and {len(path.encode())} are needed: set ipc_dir to a shorter directory (or TMPDIR, "
        f"where afctl makes one), or use scheme = 'tcp'"
    )


_SOCKET_PID = re.compile(r"(?:^|-)(\d+)-\d+\.sock$")
"""The pid in a socket's name (``_ipc_path``): the process that listens on it."""


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has exited: an orphan may never be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc here: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


def sweep_ipc_dir(config: TransportConfig, gone: Collection[int] = ()) -> bool:
    """Remove the sockets of ``config.ipc_dir`` whose process is gone (no longer running, or
    in ``gone``), then the directory if that left it empty; True if it is removed. What a
    process host whose driver was killed (kill -9: the driver's own cleanup never ran) does
    as it exits: each one out removes the dead ones' sockets, so the last one out removes
    the directory. A socket of a running process (or a file that is no socket of ours) keeps
    it; only a directory named in the config is swept, never the shared default one."""
    folder = config.ipc_dir
    if config.scheme != "ipc" or not folder:
        return False
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return True
    for entry in entries:
        found = _SOCKET_PID.search(entry.name)
        try:
            if found is None or not stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                continue
            pid = int(found[1])
            if pid in gone or not _running(pid):
                os.unlink(entry.path)
        except FileNotFoundError:  # closed meanwhile, or another host's sweep took it
            pass
    try:
        os.rmdir(folder)
    except FileNotFoundError:
        return True
    except OSError:  # not empty: a process still listens here, and removes it as it goes
        return False
    return True


def _tcp_scheme(config: TransportConfig) -> str:
    return "tls+tcp" if config.tls_dir else "tcp"


def url_host(host: str) -> str:
    """``host`` as it goes in a URL: an IPv6 literal in brackets (``[::1]``), as nng wants."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def is_tcp(address: str) -> bool:
    """tcp, with or without TLS."""
    return address.startswith(("tcp://", "tls+tcp://"))


def _tls(address: str, config: TransportConfig, server: bool) -> dict:
    """The socket options of ``address``: a TLSConfig for ``tls+tcp://``."""
    if not address.startswith("tls+tcp://"):
        return {}
    if not config.tls_dir:
        raise ValueError(f"{address} needs TLS: set [cluster.transport] tls_dir to this cluster's `afctl certs` directory")
    from asyncflow.core.tls import tls_config

    return {"tls_config": tls_config(config.tls_dir, server)}


def listen(address: str, config: TransportConfig, max_message_bytes: int | None = None) -> tuple[pynng.Rep0, str]:
    """A Rep0 listener on ``address``; returns it and the address peers dial (tcp: port
    filled in; a wildcard host replaced by ``advertise_host``). It receives frames of
    up to ``max_message_bytes`` (default: the config's)."""
    scheme, _, rest = address.partition("://")
    if is_tcp(address) and rest.rpartition(":")[0] in _WILDCARD and config.advertise_host in _WILDCARD:
        raise ValueError(
            f"[cluster.transport] bind_host = {config.bind_host!r} listens on every interface, but peers need one "
            f"address to dial: set [cluster.transport] advertise_host to this node's address, or bind_host to it "
            f"(launcher = 'ray' sets it on each node)"
        )
    sock = pynng.Rep0(
        recv_max_size=max_message_bytes or config.max_message_bytes,
        send_timeout=int(config.connect_timeout_s * 1000),
        **_tls(address, config, server=True),
    )
    if is_tcp(address) and address.endswith(":0") and config.ports:
        listener = _listen_in_range(sock, address[: -len(":0")], config)
    else:
        listener = sock.listen(address)
    if is_tcp(address):
        host, _, port = str(listener.local_address).rpartition(":")
        if host in _WILDCARD:
            host = config.advertise_host
        address = f"{scheme}://{url_host(host)}:{port}"
    return sock, address


def _listen_in_range(sock: pynng.Rep0, base: str, config: TransportConfig):
    """Listen on the first free port of ``config.ports``, from a random start (fewer
    collisions between processes starting at once)."""
    ports = config.port_range()
    assert ports is not None  # called only with config.ports set
    low, high = ports
    num_ports = high - low + 1
    start = random.randrange(num_ports)
    for k in range(num_ports):
        try:
            return sock.listen(f"{base}:{low + (start + k) % num_ports}")
        except pynng.AddressInUse:
            continue
    sock.close()
    raise ValueError(
        f"every port of [cluster.transport] ports = {config.ports!r} is taken on this node "
        f"({base}): widen the range, each actor listens on one port"
    )


def dial(address: str, config: TransportConfig) -> pynng.Req0:
    """A Req0 dialer; connects in the background and reconnects on its own.

    Resend is off: a request is delivered at most once (exactly-once is built on top)."""
    sock = pynng.Req0(
        recv_max_size=config.max_message_bytes,
        reconnect_time_min=20,
        reconnect_time_max=500,
        **_tls(address, config, server=False),
    )
    sock.resend_time = -1
    sock.dial(address, block=False)
    return sock


def set_context_timeouts(ctx: pynng.Context, timeout_s: float) -> None:
    ms = max(1, int(timeout_s * 1000))
    lib = pynng.lib
    pynng.check_err(lib.nng_ctx_set_ms(ctx.context, b"recv-timeout", ms))
    pynng.check_err(lib.nng_ctx_set_ms(ctx.context, b"send-timeout", ms))
