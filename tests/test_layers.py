"""The layer rules of ARCHITECTURE.md, checked on the source with ``ast``.

Every ``import`` and ``from ... import`` anywhere in a module counts, at module level
or inside a function, so a lazy import cannot hide a dependency. An imported name is
resolved to the deepest module of ``asyncflow`` it names (``from asyncflow.core
import protocol`` -> ``asyncflow.core.protocol``; ``from asyncflow.core.tq import
TQClient`` -> ``asyncflow.core.tq``).

Rules:
- no import cycle between modules of ``asyncflow``, counting every import (one inside
  ``if TYPE_CHECKING:`` too);
- ``asyncflow.core`` imports nothing from ``actors``, ``algorithms``, ``planner``,
  ``engines``, ``config`` or ``cli``: it knows no RL;
- ``asyncflow.config`` (the RL run's schema) imports nothing from ``actors``,
  ``algorithms``, ``planner`` or ``cli`` (it includes the engine sections), but the
  algorithms' schema (``algorithms.registry``, ``algorithms.loss_configs``), which
  imports no torch and no other algorithm or engine module;
- ``asyncflow.engines`` imports nothing from ``actors``, ``algorithms``, ``planner``,
  ``config`` or ``cli`` (but ``engines.emulated_model``, the emulated engines' device time,
  imports the planner's pure cost model), and outside it nothing imports a concrete engine (``engines.factory``
  is the only place that names one);
- ``asyncflow.engines.config`` imports no other engine module (the config is read where
  no engine runs, and must not pull torch in);
- ``asyncflow.algorithms`` imports only the engine contract from the engines
  (``engines.base``, ``engines.config``);
- ``asyncflow.toy`` (the tiny model and tasks) is imported by nothing of core, config,
  engines, algorithms or the planner;
- ``asyncflow.actors`` is folders by process (``ACTOR_PACKAGES``): every module sits in one,
  and each imports only the packages below it (``runtime`` at the bottom, ``driver`` on top);
- nothing outside the driver's process (``actors/driver/``, the CLI, the benchmarks) imports it:
  a role knows nothing of the driver that starts it;
- a module or package named ``_x`` is private: only modules of the package that holds it
  import it;
- the planner's pure modules (every module of ``asyncflow.planner`` but ``io``)
  import nothing from ``actors``, ``cli``, ``engines`` or ``planner.io``, nor
  plotting or file-system modules (matplotlib, pathlib, os, ...): file reading and
  writing and plotting live in ``asyncflow/planner/io.py``.

An exception that cannot be removed yet is an entry of ``ALLOWED`` below, with the
reason; every entry must still be needed (a stale one fails too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import asyncflow

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(asyncflow.__file__).resolve().parent

# (importer, imported) -> why it is allowed for now.
ALLOWED: dict[tuple[str, str], str] = {}

ENGINE_CONTRACT = ("asyncflow.engines.base", "asyncflow.engines.config")
ACTORS = "asyncflow.actors"
ACTOR_PACKAGES: dict[str, tuple[str, ...]] = {
    "runtime": (),
    "roles": ("runtime",),
    "weights": ("runtime",),
    "rollout": ("runtime", "weights"),
    "evaluation": ("runtime", "weights", "rollout"),
    "trainer": ("runtime", "weights", "rollout", "evaluation"),
    "driver": ("runtime", "roles", "weights", "rollout", "evaluation", "trainer"),
}
"""``asyncflow.actors`` by process: every module lives in one of these packages, and each
imports, of the other packages, only those named here. ``runtime`` is the role runtime every
worker shares (the loop, the wire messages, the run directory); ``roles`` the small column
roles; ``evaluation`` runs the rollout's episode code on held-out prompts, in the trainer's
process or its own; ``driver`` starts them all."""
DRIVER_LAYER = ("asyncflow.actors.driver", "asyncflow.cli", "asyncflow.bench")
"""What runs only in the driver's process (or the CLI's): nothing below it imports it."""

TOY_BELOW = ("asyncflow.core", "asyncflow.config", "asyncflow.engines", "asyncflow.algorithms", "asyncflow.planner")
"""Layers below the toy world (``asyncflow.toy``: the tiny model and tasks), which never import it."""
CORE_MAY_NOT_IMPORT = (
    "asyncflow.actors",
    "asyncflow.algorithms",
    "asyncflow.planner",
    "asyncflow.engines",
    "asyncflow.cli",
    "asyncflow.bench",
    "asyncflow.config",
)
CONFIG_MAY_NOT_IMPORT = ("asyncflow.actors", "asyncflow.algorithms", "asyncflow.planner", "asyncflow.cli", "asyncflow.bench")
ALGORITHM_SCHEMA = ("asyncflow.algorithms.registry", "asyncflow.algorithms.loss_configs")
"""The torch-free half of the algorithms (the registry's entries, the losses' config
Structs): the config embeds them. They import no torch and no other algorithm module."""
ENGINES_MAY_NOT_IMPORT = ("asyncflow.actors", "asyncflow.algorithms", "asyncflow.planner", "asyncflow.cli", "asyncflow.bench")
CONCRETE_ENGINES = tuple(
    f"asyncflow.engines.{m}"
    for m in (
        "native_rollout",
        "native_model",
        "families",
        "inplace_weights",
        "hf_rollout",
        "hf_cache",
        "kv_cache",
        "vllm_rollout",
        "vllm_worker",
        "torch_train",
        "emulated_rollout",
        "emulated_train",
        "emulated_model",
    )
)
EMULATED_TIME = "asyncflow.engines.emulated_model"
"""The emulated engines' device time is the planner's cost model: this one engine module may
import the planner's pure modules (never ``planner.io``), which import no engine."""
PLANNER_PURE_MAY_NOT_IMPORT = (
    "asyncflow.actors",
    "asyncflow.cli",
    "asyncflow.bench",
    "asyncflow.engines",
    "asyncflow.planner.io",
)
PLANNER_PURE_NO_THIRD_PARTY = (
    "matplotlib",
    "PIL",
    "pathlib",
    "os",
    "shutil",
    "tempfile",
    "glob",
    "io",
    "subprocess",
    "transformers",
    "torch",
)


def _module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the package."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _deepest(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Lines of the imports inside ``if TYPE_CHECKING:`` blocks (names for annotations only)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            for inner in node.body:
                lines |= {n.lineno for n in ast.walk(inner) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return lines


def imports_of(
    module: str, path: Path, modules: dict[str, Path], runtime_only: bool = False
) -> tuple[dict[str, int], dict[str, int]]:
    """(asyncflow modules imported -> first line, other top-level packages imported -> first line).
    ``runtime_only``: without the imports of ``if TYPE_CHECKING:`` blocks, which never run."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    internal: dict[str, int] = {}
    external: dict[str, int] = {}

    def add(table: dict[str, int], name: str, line: int) -> None:
        table[name] = min(line, table.get(name, line))

    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "asyncflow" or alias.name.startswith("asyncflow."):
                    target = _deepest(alias.name, modules)
                    if target:
                        add(internal, target, node.lineno)
                else:
                    add(external, alias.name.split(".")[0], node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not (source == "asyncflow" or source.startswith("asyncflow.")):
                add(external, source.split(".")[0], node.lineno)
                continue
            for alias in node.names:
                target = f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else _deepest(source, modules)
                if target:
                    add(internal, target, node.lineno)
    internal.pop(module, None)
    return internal, external


def import_graph(
    package: Path = PACKAGE, runtime_only: bool = False
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    modules = _module_files(package)
    internal, external = {}, {}
    for name, path in modules.items():
        internal[name], external[name] = imports_of(name, path, modules, runtime_only)
    return internal, external


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search, iterative)."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    for root in sorted(graph):
        if colour[root] != WHITE:
            continue
        stack = [(root, iter(sorted(graph[root])))]
        path = [root]
        colour[root] = GREY
        while stack:
            node, children = stack[-1]
            for child in children:
                if colour.get(child, BLACK) == GREY:
                    return path[path.index(child) :] + [child]
                if colour.get(child) == WHITE:
                    colour[child] = GREY
                    path.append(child)
                    stack.append((child, iter(sorted(graph[child]))))
                    break
            else:
                colour[node] = BLACK
                path.pop()
                stack.pop()
    return None


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _actor_package(module: str) -> str | None:
    """The package of ``asyncflow.actors`` a module lives in (``runtime``, ``trainer``, ...)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and module.startswith(ACTORS + ".") else None


def _private_outside(module: str, target: str) -> bool:
    """Whether ``module`` imports a ``_private`` module (or one of a ``_private`` package)
    from outside the package that holds it."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            owner = ".".join(parts[:i])
            return not _under(module, (owner,))
    return False


def layer_violations(
    internal: dict[str, dict[str, int]], external: dict[str, dict[str, int]], modules: dict[str, Path], package: Path = PACKAGE
) -> tuple[list[str], set[tuple[str, str]]]:
    """(violations not allowed, each as 'file:line: a imports b (rule)'; allow-list entries used)."""
    found: list[str] = []
    used: set[tuple[str, str]] = set()

    def where(module: str, line: int) -> str:
        return f"{modules[module].relative_to(package.parent)}:{line}"

    for module, targets in sorted(internal.items()):
        for target, line in sorted(targets.items()):
            rule = None
            if _under(module, ("asyncflow.core",)) and _under(target, CORE_MAY_NOT_IMPORT):
                rule = "core is the bottom layer"
            elif (
                _under(module, ("asyncflow.config",))
                and _under(target, CONFIG_MAY_NOT_IMPORT)
                and not _under(target, ALGORITHM_SCHEMA)
            ):
                rule = "the RL config sits above core and engines, below the roles (of the algorithms: their schema only)"
            elif (
                _under(module, ALGORITHM_SCHEMA)
                and _under(target, ("asyncflow.algorithms", "asyncflow.engines"))
                and not _under(target, ALGORITHM_SCHEMA)
            ):
                rule = "the algorithm schema is torch-free: it names functions as 'module:function', imported when built"
            elif (
                _under(module, ("asyncflow.engines",))
                and _under(target, ENGINES_MAY_NOT_IMPORT + ("asyncflow.config",))
                and not (module == EMULATED_TIME and _under(target, ("asyncflow.planner",)) and target != "asyncflow.planner.io")
            ):
                rule = "engines sit below the roles, the algorithms and the planner"
            elif not _under(module, ("asyncflow.engines",)) and _under(target, CONCRETE_ENGINES):
                rule = "a concrete engine is named only by engines/factory.py"
            elif module == "asyncflow.engines.config" and _under(target, ("asyncflow.engines",)):
                rule = "the engine config imports no engine implementation"
            elif (
                _under(module, ("asyncflow.algorithms",))
                and _under(target, ("asyncflow.engines",))
                and not _under(target, ENGINE_CONTRACT)
            ):
                rule = "algorithms import only the engine contract (engines/base.py, engines/config.py)"
            elif _under(module, TOY_BELOW) and _under(target, ("asyncflow.toy",)):
                rule = "the toy world (tiny model, tasks) sits above core, config, engines, algorithms and planner"
            elif not _under(module, DRIVER_LAYER) and _under(target, DRIVER_LAYER):
                rule = "a role knows nothing of the driver that starts it"
            elif _actor_package(module) and _actor_package(target) not in (
                None,
                _actor_package(module),
                *ACTOR_PACKAGES.get(_actor_package(module) or "", ()),
            ):
                allowed = ACTOR_PACKAGES[_actor_package(module) or ""]
                rule = f"actors/{_actor_package(module)}/ imports only {allowed} of the other actor packages"
            elif _private_outside(module, target):
                rule = "a module or package named _x is private to the package that holds it"
            elif (
                _under(module, ("asyncflow.planner",))
                and not _under(module, ("asyncflow.planner.io",))
                and _under(target, PLANNER_PURE_MAY_NOT_IMPORT)
            ):
                rule = "the planner's pure modules do no I/O and know no actors, engines or CLI"
            if rule is None:
                continue
            if (module, target) in ALLOWED:
                used.add((module, target))
                continue
            found.append(f"{where(module, line)}: {module} imports {target} ({rule})")
        if _under(module, ALGORITHM_SCHEMA) and "torch" in external[module]:
            found.append(f"{where(module, external[module]['torch'])}: {module} imports torch (the config reads it)")
        if _under(module, ("asyncflow.planner",)) and not _under(module, ("asyncflow.planner.io",)):
            for other, line in sorted(external[module].items()):
                if other in PLANNER_PURE_NO_THIRD_PARTY:
                    found.append(
                        f"{where(module, line)}: {module} imports {other} "
                        "(plotting and file I/O belong in asyncflow/planner/io.py)"
                    )
    return found, used


def test_there_is_no_import_cycle():
    """Among every import, those inside ``if TYPE_CHECKING:`` too: an import for an
    annotation still ties the two modules together (a change to either is read with the
    other), so a cycle through one is a cycle. A config section reads only itself; the
    rules across sections take the sections they read (config/validation.py)."""
    internal, _ = import_graph(runtime_only=False)
    cycle = find_cycle(internal)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_layers_import_only_downwards_and_the_allow_list_is_current():
    internal, external = import_graph()
    found, used = layer_violations(internal, external, _module_files())
    assert not found, "layer rules broken (ARCHITECTURE.md, Layers):\n" + "\n".join(found)
    stale = set(ALLOWED) - used
    assert not stale, f"allow-list entries no longer needed, remove them: {sorted(stale)}"


def test_the_checker_sees_imports_inside_functions_and_reports_a_cycle(tmp_path):
    """The rules themselves, on a planted package: a lazy import closes a cycle, core
    reaches up into actors, a pure planner module draws with matplotlib."""
    root = tmp_path / "asyncflow"
    for sub in ("core", "actors", "planner"):
        (root / sub).mkdir(parents=True)
        (root / sub / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "core" / "a.py").write_text("from asyncflow.core import b\n")
    (root / "core" / "b.py").write_text("def f():\n    from asyncflow.core.a import x\n")
    (root / "core" / "c.py").write_text("def g():\n    import asyncflow.actors.role\n")
    (root / "actors" / "role.py").write_text("")
    (root / "planner" / "sim.py").write_text("def draw():\n    import matplotlib.pyplot as plt\n")
    (root / "planner" / "io.py").write_text("import matplotlib\nfrom pathlib import Path\n")
    modules = _module_files(root)
    internal = {m: imports_of(m, p, modules)[0] for m, p in modules.items()}
    external = {m: imports_of(m, p, modules)[1] for m, p in modules.items()}
    assert find_cycle(internal) in (
        ["asyncflow.core.a", "asyncflow.core.b", "asyncflow.core.a"],
        ["asyncflow.core.b", "asyncflow.core.a", "asyncflow.core.b"],
    )
    found, _ = layer_violations(internal, external, modules, root)
    assert len(found) == 2, found
    assert "asyncflow.core.c imports asyncflow.actors.role" in found[0]
    assert "asyncflow.planner.sim imports matplotlib" in found[1]
    # an import for annotations only closes no cycle, but still counts for the layer rules
    (root / "core" / "d.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from asyncflow.core.a import x\n"
    )
    modules = _module_files(root)
    assert "asyncflow.core.a" in imports_of("asyncflow.core.d", modules["asyncflow.core.d"], modules)[0]
    assert imports_of("asyncflow.core.d", modules["asyncflow.core.d"], modules, runtime_only=True)[0] == {}


def test_core_protocol_defines_no_message_only_the_rl_roles_use():
    """core/protocol.py holds the runtime's and the queue's messages: each is named by a
    module of core. A message only the RL roles send belongs in actors/runtime/messages.py."""
    import re

    protocol = (PACKAGE / "core" / "protocol.py").read_text()
    core = "\n".join(p.read_text() for p in (PACKAGE / "core").rglob("*.py") if p.name != "protocol.py")
    defined = re.findall(r"^class (\w+)\(", protocol, re.M)
    assert defined
    unused = [name for name in defined if not re.search(rf"\b{name}\b", core)]
    assert not unused, (
        f"messages of core/protocol.py that no module of core uses (RL messages? actors/runtime/messages.py): {unused}"
    )


def test_every_actor_module_lives_in_a_package_of_its_process():
    """A new module of ``asyncflow.actors`` cannot slip past the rules above: it sits in one
    of ``ACTOR_PACKAGES`` (its process decides which), never loose beside them."""
    loose = [m for m in _module_files() if m.startswith(ACTORS + ".") and _actor_package(m) not in ACTOR_PACKAGES]
    assert not loose, f"modules of asyncflow/actors/ outside {sorted(ACTOR_PACKAGES)}: {loose}"
    folders = {p.name for p in (PACKAGE / "actors").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(ACTOR_PACKAGES), folders


def test_the_actor_rules_catch_a_planted_module(tmp_path):
    """The prefix rules on a planted package: a trainer module that reaches into the driver,
    a role that imports the trainer, and a bench module that takes another package's _private."""
    root = tmp_path / "asyncflow"
    for sub in ("actors", "actors/trainer", "actors/driver", "actors/roles", "bench", "core"):
        (root / sub).mkdir(parents=True, exist_ok=True)
        (root / sub / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "actors" / "driver" / "launcher.py").write_text("")
    (root / "actors" / "trainer" / "_pause.py").write_text("")
    (root / "actors" / "trainer" / "step.py").write_text("from asyncflow.actors.driver import launcher\n")
    (root / "actors" / "roles" / "judge.py").write_text("from asyncflow.actors.trainer import step\n")
    (root / "bench" / "b.py").write_text("from asyncflow.actors.trainer import _pause\n")
    (root / "actors" / "trainer" / "ok.py").write_text("from asyncflow.actors.trainer import _pause\n")
    modules = _module_files(root)
    internal = {m: imports_of(m, p, modules)[0] for m, p in modules.items()}
    external = {m: imports_of(m, p, modules)[1] for m, p in modules.items()}
    found, _ = layer_violations(internal, external, modules, root)
    joined = "\n".join(found)
    assert len(found) == 3, joined
    assert "trainer.step imports asyncflow.actors.driver.launcher (a role knows nothing of the driver" in joined
    assert "roles.judge imports asyncflow.actors.trainer.step (actors/roles/ imports only ('runtime',)" in joined
    assert "bench.b imports asyncflow.actors.trainer._pause (a module or package named _x is private" in joined
