"""TransferQueue: the streaming columnar data plane between RL roles.

Layout (one module, one job):
- ``client``: ``TQClient``, what every role uses (allocate, put, get_batch, ack...);
- ``shard`` / ``store``: storage shard actor and its rows; ``shm``: same-host arenas;
- ``controller`` / ``state``: one controller per consuming task and its pure state;
- ``manager`` / ``ledger``: allocation, capacity (backpressure), freeing, save/load;
- ``launch``: the actor specs of a queue and a helper that spawns them;
- ``notify``: background, batched tells; ``balance``: dp length balancing.
"""

from asyncflow.core.protocol import RowFilter, RowMeta
from asyncflow.core.tq.client import MANAGER_NAME, Batch, TQClient, controller_name, shard_name
from asyncflow.core.tq.errors import BatchTimeout, QueueFull
from asyncflow.core.tq.launch import QueueSpecs, queue_specs, spawn_queue

__all__ = [
    "MANAGER_NAME",
    "Batch",
    "BatchTimeout",
    "QueueFull",
    "QueueSpecs",
    "RowFilter",
    "RowMeta",
    "TQClient",
    "controller_name",
    "queue_specs",
    "shard_name",
    "spawn_queue",
]
