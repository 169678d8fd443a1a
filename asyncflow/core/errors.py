"""Errors raised by the actor runtime. Each names the actor and the message."""

from __future__ import annotations


class AsyncflowError(Exception):
    """Base of every asyncflow error."""


class ActorTimeout(AsyncflowError, TimeoutError):
    """A peer did not answer in time: it is dead, unreachable or overloaded."""

    def __init__(self, actor: str, address: str, message_type: str, timeout_s: float):
        super().__init__(
            f"actor {actor!r} at {address} did not answer {message_type} within {timeout_s:g} s "
            f"(is its process alive? `afctl status` lists the actors)"
        )
        self.actor = actor
        self.address = address
        self.message_type = message_type


class PeerFrozen(ActorTimeout):
    """A peer answered none of the copies of a request sent again and again for
    ``cluster.transport.freeze_timeout_s`` (``core/retry.py``): its process is frozen
    past the freeze policy (the driver kills and restarts such a process), or dead."""

    def __init__(self, actor: str, address: str, message_type: str, waited_s: float, freeze_timeout_s: float):
        AsyncflowError.__init__(
            self,
            f"actor {actor!r} at {address} answered none of the copies of {message_type} sent over {waited_s:.0f} s "
            f"(cluster.transport.freeze_timeout_s = {freeze_timeout_s:g}): its process is frozen or dead "
            f"(`afctl status` lists the actors; the driver restarts a process frozen that long, or stops the run)",
        )
        self.actor = actor
        self.address = address
        self.message_type = message_type
        self.waited_s = waited_s


class ActorGone(AsyncflowError, ConnectionError):
    """The connection to a peer broke mid-request (its process exited or restarted)."""

    def __init__(self, actor: str, address: str, message_type: str, detail: str):
        super().__init__(f"actor {actor!r} at {address} went away during {message_type}: {detail}")
        self.actor = actor
        self.address = address


class HostExited(AsyncflowError):
    """A process host exited while it was being started: before it registered, or
    while it started its actors (an import that kills the process, a device that is
    not there). Its own stderr, above in the driver's output, says why."""

    def __init__(self, host: str, returncode: int | None, during: str):
        super().__init__(f"process {host!r} exited with code {returncode} {during}; its stderr above says why")
        self.host = host
        self.returncode = returncode


class RemoteError(AsyncflowError):
    """The remote handler raised, or refused the frame; ``kind`` says which."""

    def __init__(self, actor: str, message_type: str, kind: str, detail: str):
        super().__init__(f"actor {actor!r} failed on {message_type} ({kind}): {detail}")
        self.actor = actor
        self.message_type = message_type
        self.kind = kind
        self.detail = detail


class Unauthorized(RemoteError):
    """A tcp listener refused the request: the cluster secret was wrong or missing."""


class FrameError(AsyncflowError):
    """A frame could not be decoded (truncated, random bytes, wrong schema)."""
