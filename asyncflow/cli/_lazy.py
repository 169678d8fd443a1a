"""A click group whose subcommands are imported only when used.

`afctl --help` must answer at once, without importing torch or transformers, so
each command is named here by ``module:attribute`` and imported on first use.

A wrong config value, from any command (a benchmark's ``--set`` too), ends the
command with its one-line message, which names the key and the fix, not a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util

import click

from asyncflow.core.schema import ConfigError


class LazyGroup(click.Group):
    def __init__(self, *args, lazy_commands: dict[str, tuple[str, str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        # name -> ("module:attr", one-line help shown in --help without importing)
        self._lazy = dict(lazy_commands or {})

    def _available(self, name: str) -> bool:
        module = self._lazy[name][0].split(":")[0]
        return importlib.util.find_spec(module) is not None

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(super().list_commands(ctx))
        names.update(n for n in self._lazy if self._available(n))
        return sorted(names)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self._lazy and self._available(name):
            module, attr = self._lazy[name][0].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            raise click.ClickException(f"config: {exc}") from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in self._lazy:
                rows.append((name, self._lazy[name][1]))
            else:
                cmd = super().get_command(ctx, name)
                rows.append((name, cmd.get_short_help_str() if cmd else ""))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
