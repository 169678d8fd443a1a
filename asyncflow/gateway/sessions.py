"""The gateway's recorded conversations: pure state, no HTTP, no engine.

A session is one conversation of an agent program (its id comes from the request's
``X-Session-Id`` header or ``user`` field). Its ``Trajectory`` is stored in the
shared trajectory format of the queue (docs/gateway.md):

- ``prompt_ids``: the first request's conversation through the chat template;
- ``response_ids``: every token after it, as the model saw it: the model's replies
  and the context (later messages, template glue) between them;
- ``rollout_logp``: the generating policy's log-prob of each model token, 0 on context;
- ``loss_mask``: 1 on model tokens, 0 on context;
- ``token_versions``: the policy version of each token: a reply's tokens the version of
  their generate call, or with partial rollout each the version that sampled it (a reply
  may span a weight swap); context tokens take the version of the reply's first token,
  which follows them; ``version`` is the oldest version among model tokens (a
  conservative staleness).

Invariants:
- A token is never re-tokenised: a turn appends ids; recorded ids never change.
- A session's turns are serialised (its lock); a finished (rewarded) session takes no
  more turns.
- At most ``max_sessions`` sessions are kept. To make room for a new one, the oldest
  finished session is dropped first, then the oldest anonymous one (a request that
  named no session: its agent can only continue it by the id it was sent back) that
  is not taking a turn; when every kept session is a named open one, a new one is
  refused (HTTP 429). Anonymous requests alone can never fill the store for good.
- A restored session (``restore``: a restarted replica's journal) keeps whether it was
  anonymous, and is kept whatever the room: a restart never refuses what the store held.
- A session id is 1 to ``MAX_SESSION_ID`` printable ASCII characters, no ``/`` and no
  space at either end (``check_session_id``): it travels back in an HTTP header and
  names a URL path segment.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from asyncflow.gateway.chat import Message

MAX_SESSION_ID = 128
SESSION_ID = re.compile(r"[!-.0-~]([ -.0-~]*[!-.0-~])?")
"""Printable ASCII but ``/`` (it names a URL path segment), spaces inside only (an HTTP
header strips them at the ends)."""


def check_session_id(session: str) -> str:
    """``session`` if it is a usable id; a 400 saying what to send otherwise."""
    if len(session) > MAX_SESSION_ID or not SESSION_ID.fullmatch(session):
        shown = session[:40] + ("..." if len(session) > 40 else "")
        raise RequestError(
            400,
            f"session id {shown!r} ({len(session)} characters): use 1 to {MAX_SESSION_ID} printable ASCII characters, "
            "no '/' and no space at either end (the X-Session-Id header, or the request's user field)",
            "invalid_session_id",
        )
    return session


class RequestError(Exception):
    """A request the gateway refuses: its HTTP status and a message saying what to change."""

    def __init__(self, status: int, message: str, code: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers


@dataclass
class Trajectory:
    session: str
    prompt_ids: list[int]
    messages: list[Message] = field(default_factory=list)
    """The conversation as recorded: the requests' messages and the replies as returned."""
    response_ids: list[int] = field(default_factory=list)
    rollout_logp: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    last_reply_ids: list[int] = field(default_factory=list)
    finish: str = ""
    """How the last reply ended: 'stop' or 'length'."""
    num_turns: int = 0
    reward: float | None = None
    updated_s: float = field(default_factory=time.time)
    group: str | None = None
    """The group key (``X-Group-Id``, or the reward's ``group``): sessions sharing it form a GRPO group."""
    digests: dict[int, int] = field(default_factory=dict)
    """The weights digest of each version that generated a turn (0: unknown)."""
    last_turn: dict[str, Any] = field(default_factory=dict)
    """The last reply as it was answered (text, log-probs, finish, version, prompt tokens): a retried
    request whose answer was lost gets it again."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.reward is not None

    @property
    def version(self) -> int:
        """The oldest policy version among the model's tokens (-1 before the first reply)."""
        model = [v for v, m in zip(self.token_versions, self.loss_mask) if m]
        return min(model) if model else -1

    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_turn(
        self,
        request: list[Message],
        context_ids: list[int],
        reply_ids: list[int],
        reply_logp: list[float],
        reply: str,
        finish: str,
        version: int,
        digest: int = 0,
        reply_versions: list[int] | None = None,
        digests: dict[int, int] | None = None,
    ) -> None:
        """Record one turn: ``context_ids`` (the new messages' tokens, outside the
        loss), then the model's reply with its log-probs; ``request`` is the whole
        conversation the request sent. ``version`` (digest ``digest``) generated the
        reply, or with ``reply_versions`` (partial rollout: one per reply token,
        ``version`` their first) each token its own, ``digests`` of each."""
        if len(reply_logp) != len(reply_ids):
            raise ValueError(f"{len(reply_ids)} reply tokens but {len(reply_logp)} log-probs")
        if reply_versions is not None and (len(reply_versions) != len(reply_ids) or reply_versions[:1] not in ([], [version])):
            raise ValueError(f"{len(reply_ids)} reply tokens from v{version} but versions {reply_versions}")
        self.response_ids += list(context_ids) + list(reply_ids)
        self.rollout_logp += [0.0] * len(context_ids) + [float(x) for x in reply_logp]
        self.loss_mask += [0] * len(context_ids) + [1] * len(reply_ids)
        self.token_versions += [version] * len(context_ids)
        self.token_versions += [int(v) for v in reply_versions] if reply_versions is not None else [version] * len(reply_ids)
        for v, d in (digests or {}).items():
            self.digests.setdefault(int(v), d)
        self.messages = [*request, {"role": "assistant", "content": reply}]
        self.last_reply_ids = list(reply_ids)
        self.finish = finish
        self.num_turns += 1
        self.updated_s = time.time()
        self.digests.setdefault(version, digest)
        self.last_turn = {"text": reply, "logp": [float(x) for x in reply_logp], "finish": finish, "version": version}

    def is_retry(self, request: list[Message]) -> bool:
        """``request`` is the one the last reply answered (sent again: its answer was lost)."""
        return self.num_turns > 0 and request == self.messages[:-1]

    def new_messages(self, request: list[Message]) -> list[Message]:
        """The messages of ``request`` after the recorded conversation, which it must repeat."""
        n = len(self.messages)
        if request[:n] != self.messages:
            first = next((i for i, (a, b) in enumerate(zip(request, self.messages)) if a != b), min(len(request), n))
            raise RequestError(
                409,
                f"session {self.session!r}: the messages do not repeat its recorded conversation ({n} messages; they differ "
                f"from message {first} on): send the conversation as recorded (the replies as returned) plus new messages, "
                "or use a new session id",
                "session_mismatch",
            )
        new = request[n:]
        if not new:
            raise RequestError(400, f"session {self.session!r}: the request adds no message after the recorded conversation")
        if new[-1]["role"] == "assistant":
            raise RequestError(400, "the last message is an assistant message: the gateway generates the assistant's turn")
        return new

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "prompt_ids": self.prompt_ids,
            "response_ids": self.response_ids,
            "rollout_logp": self.rollout_logp,
            "loss_mask": self.loss_mask,
            "token_versions": self.token_versions,
            "version": self.version,
            "finish": self.finish,
            "num_turns": self.num_turns,
            "reward": self.reward,
            "messages": self.messages,
        }


class SessionStore:
    def __init__(self, max_sessions: int):
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, Trajectory | None] = OrderedDict()  # None: reserved, first turn running
        self._anonymous: set[str] = set()  # ids the gateway made up for requests that named none
        self._lock = threading.Lock()
        self.dropped = 0
        """Sessions dropped to make room (finished or anonymous)."""

    def get(self, session: str) -> Trajectory:
        with self._lock:
            t = self._sessions.get(session)
        if t is None:
            raise RequestError(404, f"no session {session!r} (not started, or dropped: max_sessions)", "session_not_found")
        return t

    def ids(self) -> list[str]:
        with self._lock:
            return [k for k, v in self._sessions.items() if v is not None]

    def lookup(self, session: str) -> Trajectory | None:
        with self._lock:
            return self._sessions.get(session)

    def reserve(self, session: str, anonymous: bool = False) -> list[str]:
        """Claim a new session id (its first turn is being generated), making room if
        needed (the module's rule); refused while the id is taken or every kept
        session is a named open one. ``anonymous``: the gateway made the id up.
        Returns the sessions dropped to make room (more than one only in a store that a
        restore left over ``max_sessions``)."""
        with self._lock:
            if session in self._sessions:
                raise RequestError(409, f"session {session!r} is already taking its first turn", "session_busy")
            needed = len(self._sessions) - self.max_sessions + 1
            victims: list[str] = []
            if needed > 0:
                finished = [k for k, v in self._sessions.items() if v is not None and v.finished]
                idle = [k for k in self._sessions if k in self._anonymous and self._idle(self._sessions[k])]
                victims = (finished + [k for k in idle if k not in finished])[:needed]
                if len(victims) < needed:
                    raise RequestError(
                        429,
                        f"{len(self._sessions)} named sessions are open (max_sessions): finish some with a reward, "
                        "or raise [rollout.gateway] max_sessions",
                        "too_many_sessions",
                    )
                for victim in victims:
                    del self._sessions[victim]
                    self._anonymous.discard(victim)
                self.dropped += len(victims)
            self._sessions[session] = None
            if anonymous:
                self._anonymous.add(session)
            return victims

    def restore(self, t: Trajectory, anonymous: bool = False) -> None:
        """Keep ``t`` as a replica before this one kept it (its journal), whatever the room:
        a restart never drops nor refuses a session. A store left over ``max_sessions`` (a
        lower one since) makes room again as sessions finish or are dropped."""
        with self._lock:
            self._sessions[t.session] = t
            if anonymous:
                self._anonymous.add(t.session)

    def is_anonymous(self, session: str) -> bool:
        """The gateway made ``session`` up (the request named none)."""
        with self._lock:
            return session in self._anonymous

    @staticmethod
    def _idle(t: Trajectory | None) -> bool:
        """Recorded and not taking a turn now."""
        return t is not None and not t.lock.locked()

    def expire(self, now_s: float, timeout_s: float) -> list[Trajectory]:
        """Drop the open sessions whose last turn is older than ``timeout_s`` and that
        are not taking a turn; returns them."""
        with self._lock:
            old = [
                t
                for t in self._sessions.values()
                if t is not None and not t.finished and now_s - t.updated_s > timeout_s and self._idle(t)
            ]
            for t in old:
                del self._sessions[t.session]
                self._anonymous.discard(t.session)
        return old

    def release(self, session: str) -> None:
        """Give back a reserved id whose first turn failed."""
        with self._lock:
            if self._sessions.get(session, 0) is None:
                del self._sessions[session]
                self._anonymous.discard(session)

    def add(self, t: Trajectory) -> None:
        with self._lock:
            self._sessions[t.session] = t
