"""The serve mode of a rollout replica (``[rollout.gateway] train``): the run's data
comes from the gateway, so the replica takes no rows from the queue; it only keeps its
engine's weights current for the gateway's requests.

One ``work_once``: swap in staged weights (under the engine lock, between two of the
gateway's generate calls), stop once the held version is the last step's, else wait for
the next announcement (which wakes it at once) or the weights on the way. With
``[workflow] partial_rollout`` the replica runs ``stream.py`` instead, whose stream
serves the gateway's requests and swaps weights between its decode steps.

Invariant: the gateway's replies are generated with the newest weights this replica
has swapped in; the staleness of what they become is the trainer's to check (it drops
sessions older than its bound, ``actors/trainer/sources/sessions.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncflow.actors.rollout.replica import Replica


class ServeOnly:
    def __init__(self, replica: Replica):
        self.replica = replica

    def close(self) -> None:
        """Nothing held between units."""

    def work_once(self) -> bool:
        a = self.replica
        a.inbox.swap_staged()
        if a.engine.version >= a.run.config.train.num_steps:
            return False
        a.inbox.wait_for_news(a.announce_wait_s)
        return True
