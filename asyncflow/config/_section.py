"""The base of every config section (a ``[table]`` of cluster.toml)."""

import msgspec


class Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A ``[section]``. Its single-field rules are constraints on the fields; its
    cross-field rules are one ``check(run)`` method (core/schema.py) that reads the
    section alone (``run: object``) and raises ``Refused(key, fix)`` with the key relative
    to the section. A rule that reads another section is a function of
    ``config/validation.py``, which takes the sections it reads."""
