"""The rollout replica (``rollout.<i>``), one module per part:

- ``actor.py``: ``RolloutActor``, the thin actor (set-up, the weight announcements,
  counters, stop) and ``ROLE``;
- ``inbox.py``: ``WeightInbox``, its weight versions from announced to swapped in;
- ``unit.py``: the unit mode (one generate call per unit; multi-turn units too);
- ``stream.py``: the partial-rollout mode (one stream, swaps between decode steps);
- ``multiturn.py``: the environment driver of multi-turn units;
- ``pack.py``: the output columns and their dtypes, for every mode;
- ``replica.py``: what a mode uses of its replica (a Protocol).
"""

from asyncflow.actors.rollout.actor import ANNOUNCE_WAIT_S, ROLE, RolloutActor

__all__ = ["ANNOUNCE_WAIT_S", "ROLE", "RolloutActor"]
