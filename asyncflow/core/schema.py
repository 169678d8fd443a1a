"""Config schemas as msgspec Structs: rules on the fields, a validator per section.

Knows no RL: ``config/`` (the ``cluster.toml`` schema) and ``engines/config.py``
(the engine sections) use it.

- A single-field rule is a constraint on the field's type
  (``Annotated[int, Meta(ge=1, description=...)]``): msgspec checks it while decoding,
  and ``docs/config.md`` shows it beside the field's description.
- A rule between fields of one section is one ``check(self, run)`` method on the section
  Struct that holds the key it blames. It raises ``Refused(key, fix)`` with the key
  relative to the section (``"engine.fsdp"`` in ``[train]``); ``check_tree`` adds the
  section's dotted path and the value, so a rule never spells a full key path. ``run``
  is the whole config; the rules that read other sections are the root's ``check``
  (with full dotted keys), run after every section's own.
- Nothing here reads the file system: whether paths exist is checked after the schema.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Any

import msgspec

_FROM_SECTION = object()


class Refused(ValueError):
    """A cross-field rule is broken: ``key`` (relative to the section whose ``check``
    raised it) and ``fix``, what to change. ``value`` defaults to the key's value."""

    def __init__(self, key: str, fix: str, value: Any = _FROM_SECTION) -> None:
        super().__init__(f"{key}: {fix}")
        self.key, self.fix, self.value = key, fix, value


class ConfigError(ValueError):
    """A config value is wrong; the message names the key and the fix."""


def _value_at(node: Any, key: str) -> Any:
    for part in key.split("."):
        node = getattr(node, part)
    return node


def sections(struct: msgspec.Struct, path: str = "") -> Iterator[tuple[str, msgspec.Struct]]:
    """Every Struct in ``struct`` with its dotted path, depth first, parents before
    children, in field order; entries of a list of Structs as ``name[i]``."""
    yield path, struct
    for name in struct.__struct_fields__:
        value = getattr(struct, name)
        sub = f"{path}.{name}" if path else name
        if isinstance(value, msgspec.Struct):
            yield from sections(value, sub)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if isinstance(item, msgspec.Struct):
                    yield from sections(item, f"{sub}[{i}]")


def check_tree(root: msgspec.Struct) -> None:
    """Run every section's ``check(root)``, nested sections after the section that
    holds them, and the root's own ``check`` last (its rules read across the sections,
    whose own rules have passed by then); the first broken rule raises ``ConfigError``:
    ``key = value: fix`` with the full dotted key."""
    below, top = list(sections(root))[1:], ("", root)
    for path, section in [*below, top]:
        check = getattr(section, "check", None)
        if check is None:
            continue
        try:
            check(root)
        except Refused as exc:
            value = _value_at(section, exc.key) if exc.value is _FROM_SECTION else exc.value
            key = f"{path}.{exc.key}" if path else exc.key
            raise ConfigError(f"{key} = {value!r}: {exc.fix}") from None


def struct_type(hint: Any) -> type[msgspec.Struct] | None:
    """The Struct type a field holds (itself, or the element of a list of them)."""
    hint = _strip(hint)
    if typing.get_origin(hint) in (list, tuple):
        hint = _strip(typing.get_args(hint)[0])
    return hint if isinstance(hint, type) and issubclass(hint, msgspec.Struct) else None


def struct_types(hint: Any) -> list[type[msgspec.Struct]]:
    """The Structs a field may hold: ``struct_type``'s one, or each member of a union of
    tagged Structs (``[algorithm.loss]``: one per policy loss, told apart by ``name``)."""
    one = struct_type(hint)
    if one is not None:
        return [one]
    members = typing.get_args(_strip(hint)) if typing.get_origin(_strip(hint)) is typing.Union else ()
    return [m for m in members if isinstance(m, type) and issubclass(m, msgspec.Struct)]


def union_at(root: type[msgspec.Struct], path: str) -> list[type[msgspec.Struct]]:
    """The Structs a union field at a dotted path may hold (``algorithm.loss``); [] where the
    path is not a union of Structs."""
    parent, _, name = path.rpartition(".")
    cls = struct_at(root, parent) if parent else root
    hints = typing.get_type_hints(cls, include_extras=True) if cls else {}
    members = struct_types(hints[name]) if name in hints else []
    return members if len(members) > 1 else []


def _strip(hint: Any) -> Any:
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    return hint


def literal_values(hint: Any) -> tuple[Any, ...]:
    """The values of a ``Literal`` type in the order written (msgspec sorts them)."""
    hint = _strip(hint)
    return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else ()


def struct_at(root: type[msgspec.Struct], path: str) -> type[msgspec.Struct] | None:
    """The Struct type at a dotted path (``rollout.engine``, ``roles[0]``) below ``root``."""
    cls: type[msgspec.Struct] | None = root
    for part in [p for p in path.replace("]", "").replace("[", ".").split(".") if p and not p.isdigit()]:
        hints = typing.get_type_hints(cls, include_extras=True) if cls else {}
        if part not in hints:
            return None
        cls = struct_type(hints[part])
    return cls


def field_info(cls: type, name: str) -> msgspec.inspect.Field:
    """msgspec's view of one field: its type with the constraints merged, its default,
    and ``extra_json_schema`` holding the description."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    return next(f for f in info.fields if f.name == name)


def description(field: msgspec.inspect.Field) -> str:
    t = field.type
    if isinstance(t, msgspec.inspect.Metadata):
        return " ".join(str((t.extra_json_schema or {}).get("description", "")).split())
    return ""


def bare_type(t: msgspec.inspect.Type) -> msgspec.inspect.Type:
    """The type without its ``Metadata`` wrapper (which holds the description)."""
    return t.type if isinstance(t, msgspec.inspect.Metadata) else t


def allowed_range(t: msgspec.inspect.Type) -> str:
    """The range of a numeric type (``>= 1``, ``between 0 and 1``, ``> 0 and <= 1``);
    for a list, optional or tuple, that of its numbers; empty when it has none."""
    t = bare_type(t)
    if isinstance(t, (msgspec.inspect.IntType, msgspec.inspect.FloatType)):
        low = (">=", t.ge) if t.ge is not None else ((">", t.gt) if t.gt is not None else None)
        high = ("<=", t.le) if t.le is not None else (("<", t.lt) if t.lt is not None else None)
        if low and high and low[0] == ">=" and high[0] == "<=":
            return f"between {low[1]} and {high[1]}"
        return " and ".join(f"{b[0]} {b[1]}" for b in (low, high) if b)
    if isinstance(t, msgspec.inspect.UnionType):
        return next((r for r in map(allowed_range, t.types) if r), "")
    if isinstance(t, (msgspec.inspect.ListType, msgspec.inspect.VarTupleType)):
        return allowed_range(t.item_type)
    if isinstance(t, msgspec.inspect.TupleType):
        return next((r for r in map(allowed_range, t.item_types) if r), "")
    return ""


def type_name(t: msgspec.inspect.Type) -> str:
    """A short name of a field's type, as a TOML writer sees it: ``int``,
    ``'sync' | 'async'``, ``list[str]``, ``int | None``."""
    t = bare_type(t)
    m = msgspec.inspect
    simple = {m.IntType: "int", m.FloatType: "float", m.StrType: "str", m.BoolType: "bool", m.NoneType: "None", m.AnyType: "Any"}
    if type(t) in simple:
        return simple[type(t)]
    if isinstance(t, m.LiteralType):
        return " | ".join(repr(v) for v in t.values)
    if isinstance(t, m.UnionType):
        return " | ".join(type_name(x) for x in t.types)
    if isinstance(t, m.ListType):
        return f"list[{type_name(t.item_type)}]"
    if isinstance(t, m.VarTupleType):
        return f"tuple[{type_name(t.item_type)}, ...]"
    if isinstance(t, m.TupleType):
        return f"tuple[{', '.join(type_name(x) for x in t.item_types)}]"
    if isinstance(t, m.DictType):
        return f"dict[{type_name(t.key_type)}, {type_name(t.value_type)}]"
    if isinstance(t, m.StructType):
        return t.cls.__name__
    return type(t).__name__.removesuffix("Type").lower()
