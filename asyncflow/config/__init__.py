"""The RL run's configuration, above ``core`` (which knows no RL) and ``engines``
(whose sections it includes):

- ``run.py``: the typed ``cluster.toml`` schema (``RunConfig``), loading, ``--set``
  overrides, and the generated docs/config.md (``python -m asyncflow.config.run --markdown``);
- ``resumable.py``: the keys a resume may change.

The rule machinery it uses (``ConfigError``, ranges on the fields, one ``check()`` per
section) is generic and lives in ``core/schema.py``.
"""
