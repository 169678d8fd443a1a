"""asyncflow: asynchronous streaming RL post-training for LLMs.

Subpackages: ``core`` (actor runtime over nng, wire protocol, TransferQueue,
config), ``actors`` (one RL role per file), ``engines`` (rollout/training engines
behind interfaces), ``algorithms`` (GRPO, PPO, rewards), ``planner`` (cost model,
search, simulation), ``cli`` (the ``afctl`` command).
"""

__version__ = "0.1.0"
