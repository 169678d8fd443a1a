"""What a rollout mode (``unit.py``, ``stream.py``) uses of its replica
(``RolloutActor``, ``actor.py``): named by shape, not imported, since the actor
imports the modes."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from asyncflow.actors.rollout.inbox import WeightInbox
    from asyncflow.actors.rollout.multiturn import MultiTurnDriver
    from asyncflow.actors.runtime.acks import DeferredAcks
    from asyncflow.actors.runtime.run_dir import Run
    from asyncflow.actors.runtime.scoring import Scorer
    from asyncflow.core.actor import ActorContext
    from asyncflow.core.tq.client import TQClient
    from asyncflow.engines.config import SamplingParams


class Replica(Protocol):
    ctx: ActorContext
    run: Run
    engine: Any  # a RolloutEngine (the stream needs one with open_stream: native, hf or emulated)
    engine_lock: threading.Lock  # held around every generate call and swap (the gateway shares the engine)
    params: SamplingParams
    tq: TQClient
    acks: DeferredAcks
    k: int
    announce_wait_s: float  # actor.ANNOUNCE_WAIT_S
    queue_wait_s: float  # actor.QUEUE_WAIT_S
    num_items: int
    inbox: WeightInbox
    scorer: Scorer | None  # reward.placement = "rollout"
    multiturn: MultiTurnDriver | None  # [env] path
    gateway: Any  # the gateway (gateway/server.py Gateway) on the replica that serves it, else None

    def activity(self, name: str) -> AbstractContextManager: ...
    def count_decode(self, stats: Any) -> None: ...
