"""The tiny end-to-end config of the tests: ``examples/tiny.toml`` with some keys changed.

    write_tiny_config(path, {"train": {"num_steps": 8}, "train.engine": {"fsdp": True}}, extra="[[roles]]...")

Each key of ``changes`` is a table (``"train.engine"``); its values replace the keys
of that table in the file, or are added under it (the table is added if missing).
``extra`` is TOML appended as is (tables the example does not have, such as
``[cluster]`` or ``[[roles]]``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TINY = Path(__file__).resolve().parent.parent / "examples" / "tiny.toml"


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str, list)):
        return json.dumps(value)  # the JSON of these is valid TOML
    raise TypeError(f"cannot write {value!r} as a TOML value here")


def tiny_config_text(changes: dict[str, dict[str, Any]] | None = None, extra: str = "") -> str:
    lines = TINY.read_text().splitlines()
    for table, values in (changes or {}).items():
        header = f"[{table}]"
        if header not in lines:
            lines += ["", header]
        start = lines.index(header) + 1
        end = next((i for i in range(start, len(lines)) if lines[i].startswith("[")), len(lines))
        for key, value in values.items():
            line = f"{key} = {toml_value(value)}"
            found = [i for i in range(start, end) if lines[i].split("=")[0].strip() == key]
            if found:
                lines[found[0]] = line
            else:
                lines.insert(end, line)
                end += 1
    return "\n".join(lines) + "\n" + extra


def write_tiny_config(path: Path, changes: dict[str, dict[str, Any]] | None = None, extra: str = "") -> Path:
    path.write_text(tiny_config_text(changes, extra))
    return path
