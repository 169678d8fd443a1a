"""The RL run's configuration, above ``core`` (which knows no RL) and ``engines``
(whose sections it includes). One module per area, each a few ``[sections]``:

- ``model.py`` (``[model]``, ``[data]``), ``algorithm.py``, ``roles.py`` (``[rollout]``,
  ``[reference]``, ``[reward]``, ``[reward_model]``, ``[critic]``, ``[[roles]]``),
  ``gateway.py``, ``train.py`` (``[train]``, ``[eval]``), ``workflow.py`` (``[queue]``,
  ``[workflow]``), ``cluster.py`` (``[cluster]``, ``[logging]``), ``planner.py``, ``env.py``;
  each section a ``Section`` (``_section.py``) whose ``check`` reads itself alone; a role's
  section holds the ``devices`` its instances see;
- ``validation.py``: the rules that read several sections, one function each, taking the
  sections it reads;
- ``run.py``: ``RunConfig``, the whole ``cluster.toml``, and ``validate`` (every section's
  ``check``, then ``validation.py``'s rules) and ``check_paths``;
- ``load.py``: TOML text or a file to a validated ``RunConfig``, ``--set`` overrides,
  relative paths, and errors that name the key and the fix;
- ``docs.py``: docs/config.md, generated from the schema
  (``python -m asyncflow.config.docs --markdown``);
- ``names.py``: the reserved role names; ``resumable.py``: the keys a resume may change.

The rule machinery it uses (``ConfigError``, ranges on the fields, one ``check()`` per
section) is generic and lives in ``core/schema.py``.
"""
