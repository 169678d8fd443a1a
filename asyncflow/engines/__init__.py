"""Rollout and training engines behind two small interfaces; see README.md here.

Nothing is imported at package level (``asyncflow.engines.config`` must stay cheap
to import for the CLI): use ``asyncflow.engines.factory`` to build engines and
``asyncflow.engines.base`` for the interfaces and result types.
"""
