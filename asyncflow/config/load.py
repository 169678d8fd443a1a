"""Loading a config: TOML text or a file, ``--set`` overrides, relative paths, and the
errors that name the key and the fix."""

from __future__ import annotations

import logging
import os
import re
import typing
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path

import msgspec
import tomllib

from asyncflow.config import hub
from asyncflow.config.run import RunConfig, _warn, check_paths, validate
from asyncflow.core import schema
from asyncflow.core.schema import ConfigError

log = logging.getLogger(__name__)


def _field(path: str) -> msgspec.inspect.Field | None:
    """msgspec's view of the field at a dotted key (``train.num_steps``,
    ``rollout.devices[1]``, ``roles[0].name``), if there is one."""
    parent, _, name = re.sub(r"\[\d+\]$", "", path).rpartition(".")
    cls = schema.struct_at(RunConfig, parent) if parent else RunConfig
    if cls is None and parent:  # a union ([algorithm.loss]): the first of its Structs that has the key
        cls = next((m for m in schema.union_at(RunConfig, parent) if name in m.__struct_fields__), None)
    if cls is None or name not in cls.__struct_fields__:
        return None
    return schema.field_info(cls, name)


def _choices(path: str) -> str:
    """``; use one of 'sync', 'async'`` for a key whose type is a Literal."""
    parent, _, name = path.rpartition(".")
    cls = schema.struct_at(RunConfig, parent) if parent else RunConfig
    hint = typing.get_type_hints(cls, include_extras=True).get(name) if cls else None
    values = schema.literal_values(hint)
    members = schema.union_at(RunConfig, parent) if parent else []
    if members and name == members[0].__struct_config__.tag_field:  # which loss: the registry's names
        values = tuple(m.__struct_config__.tag for m in members)
    return "; use one of " + ", ".join(repr(v) for v in values) if values else ""


def _range_of(path: str) -> str:
    """The allowed range of the numeric key at ``path`` from its field's constraints
    (``>= 1``, ``between 0 and 1``); empty when it has none."""
    field = _field(path)
    return schema.allowed_range(field.type) if field else ""


def _where(key: str) -> str:
    """Where a key is set: ``[train] num_steps, or --set train.num_steps=...``."""
    bare = re.sub(r"\[\d+\]", "", key)
    parent, _, name = bare.rpartition(".")
    if parent == "roles":  # an array of tables: --set cannot reach into it
        return f"[[roles]] {name}"
    return f"[{parent}] {name}, or --set {bare}=..." if parent else f"{name} at the top level, or --set {bare}=..."


def _raw_value(raw: dict, path: str):
    """The value at a dotted path of the parsed TOML (``None`` when absent)."""
    node = raw
    for part in re.findall(r"[^.\[\]]+", path):
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, TypeError, ValueError):
            return None
    return node


MOVED_KEYS = {
    "algorithm.clip_eps": "moved to the loss's own section: [algorithm.loss] clip_low and clip_high "
    "(--set algorithm.loss.clip_low=... --set algorithm.loss.clip_high=...)",
    "algorithm.loss_agg": 'moved to the loss\'s own section: [algorithm.loss] agg ("token-mean"; '
    '"seq-mean-token-mean" for the old "seq_mean"; or "seq-mean-token-sum")',
}
"""Keys that left a section, and where they went (the error of a config that still sets one)."""


def _format_error(
    exc: msgspec.ValidationError, source: str, raw: dict | None = None, overrides: Sequence[str] = ()
) -> ConfigError:
    import difflib

    text = str(exc)
    what, _, where = text.rpartition(" - at `$.")
    key = where.rstrip("`") if what else ""
    what = what or text
    given = {item.partition("=")[0].strip(): item for item in overrides}
    if key and key.split("[")[0] in given:  # the value came from the command line, not the file
        source = f"--set {given[key.split('[')[0]]}"
    if what.startswith("Object contains unknown field"):
        unknown = what.split("`")[1]
        moved = MOVED_KEYS.get(f"{key}.{unknown}" if key else unknown)
        if moved:
            return ConfigError(f"{key}.{unknown}: {moved} (in {source}; keys are documented in docs/config.md)")
        cls = schema.struct_at(RunConfig, key) if key else RunConfig
        known = list(cls.__struct_fields__) if cls else []
        for member in schema.union_at(RunConfig, key) if key else []:  # [algorithm.loss]: every loss's keys
            tag = member.__struct_config__.tag_field
            known += [k for k in (tag or "", *member.__struct_fields__) if k and k not in known]
        close = difflib.get_close_matches(unknown, known, n=1)
        full = f"{key}.{unknown}" if key else unknown
        if full in given:
            source = f"--set {given[full]}"
        fix = f"did you mean {close[0]!r}?" if close else f"known keys here: {', '.join(known)}"
        return ConfigError(f"{full}: unknown key; {fix} (in {source}; keys are documented in docs/config.md)")
    allowed = _range_of(key) if key and ", got" not in what else ""
    if allowed:  # a constraint: the key, the value and the range
        return ConfigError(
            f"{key} = {_raw_value(raw or {}, key)!r}: out of range; use a value {allowed} "
            f"(in {source}; set it in {_where(key)}; docs/config.md says what it means)"
        )
    if key:
        return ConfigError(f"{key}: {what}{_choices(key)} (in {source}); set it in {_where(key)}")
    return ConfigError(f"{what} (in {source})")


def apply_overrides(raw: dict, overrides: Sequence[str]) -> dict:
    """Set ``KEY=VALUE`` items (``train.engine.lr=3e-4``) into a parsed config; VALUE
    is a TOML value (``true``, ``2``, ``"a"``, ``[0, 1]``), bare words are strings."""
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {item!r}: write KEY=VALUE with a dotted key, e.g. --set train.num_steps=10")
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()  # a bare word: a string
        table = raw
        *parents, leaf = key.split(".")
        for depth, part in enumerate(parents):
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise ConfigError(f"--set {item!r}: {'.'.join(parents[: depth + 1])} is a value, not a table")
        table[leaf] = value
    return raw


def load_config_text(
    text: str, source: str = "<string>", overrides: Sequence[str] = (), base_dir: str | os.PathLike | None = None
) -> RunConfig:
    """The config in ``text``. ``base_dir``: the directory relative paths in it are
    relative to (that of the config file); None: the working directory."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from None
    apply_overrides(raw, overrides)
    loss = raw.get("algorithm", {}).get("loss") if isinstance(raw.get("algorithm"), dict) else None
    if isinstance(loss, dict):  # a union of losses needs its tag: without one, the default loss's keys are meant
        loss.setdefault("name", "ppo_clip")
    try:
        cfg = msgspec.convert(raw, RunConfig)
    except msgspec.ValidationError as exc:
        raise _format_error(exc, source, raw, overrides) from None
    given = {item.partition("=")[0].strip() for item in overrides}  # a --set path is relative to the working directory
    _resolve_paths(cfg, Path(base_dir) if base_dir is not None else None, source, given)
    validate(cfg)
    check_paths(cfg)
    _warn(cfg)
    return cfg


def _resolve_paths(cfg: RunConfig, base: Path | None, source: str, given: AbstractSet[str] = frozenset()) -> None:
    """Paths in a config file are relative to the file's directory: ``model.path``,
    ``data.path``, ``cluster.python_path``, so a run works from any directory. A
    ``model.path`` that is a checkpoint (``checkpoints/step_N``, with the Hugging Face
    model in ``step_N/model``) means that model directory. A path given with
    ``--set`` (keys in ``given``) is relative to the working directory. A model path
    that exists nowhere and has the shape of a Hugging Face hub id (``org/name``) is that
    model's snapshot directory in the hub cache, downloaded when the machine is online
    (``config/hub.py``): resolved here, once, so the run's config.json holds it."""

    def resolve(key: str, value: str) -> str:
        path = local(key, value)
        if not os.path.exists(path) and hub.is_hub_id(value):  # "org/name": a hub model, unless such a path exists
            return hub.resolve(key, value)
        return path

    def local(key: str, value: str) -> str:
        if key in given:
            return os.path.abspath(value)
        if base is None or os.path.isabs(value):
            return value
        beside = base / value
        if not beside.exists() and os.path.exists(value):  # older configs: relative to the working directory
            log.warning(
                "%s = %r is relative to the working directory; paths in a config file are relative to "
                "the file (%s): write %r, or an absolute path",
                key,
                value,
                source,
                os.path.relpath(os.path.abspath(value), base),
            )
            return os.path.abspath(value)
        return str(beside.resolve())

    if cfg.model.path:
        cfg.model.path = resolve("model.path", cfg.model.path)
        if not os.path.isfile(os.path.join(cfg.model.path, "config.json")) and os.path.isfile(
            os.path.join(cfg.model.path, "model", "config.json")
        ):
            cfg.model.path = os.path.join(cfg.model.path, "model")  # a checkpoint directory: its model
    if cfg.data.path:
        cfg.data.path = local("data.path", cfg.data.path)
    if cfg.reward_model.path:
        cfg.reward_model.path = resolve("reward_model.path", cfg.reward_model.path)
    if base is not None and cfg.cluster.python_path:
        resolved = [str((base / p).resolve()) for p in cfg.cluster.python_path]
        for key_value, p in zip(cfg.cluster.python_path, resolved):
            if not os.path.isdir(p):
                raise ConfigError(
                    f"cluster.python_path: {key_value!r} is {p}, not a directory (paths are relative "
                    f"to the config file, {source})"
                )
        cfg.cluster.python_path = resolved


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> RunConfig:
    """The config in ``path``, with ``KEY=VALUE`` overrides (``afctl up --set``) applied;
    its relative paths are relative to ``path``'s directory."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    return load_config_text(path.read_text(), str(path), overrides, base_dir=path.parent)


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as TOML-compatible JSON-ish text (written to RUN_DIR/config.json)."""
    return msgspec.json.format(msgspec.json.encode(cfg).decode(), indent=2)
