"""The packages follow the architecture: imports point down the layers, never up, and never in a circle.

Layers, from the bottom (docs/architecture.md, "Layers"):

0. ``mneme`` (the core): model, format, store, recording, replay, llvm, apply, shared rules, fixtures;
1. ``record_agent`` and ``replay_server`` (the record agent; the replay servers' contract, client and
   server), which never import each other;
2. ``tuner``;
3. entry points: the ``mneme`` command line (``mneme.cli``, ``mneme.__main__``) and
   ``replay_server.__main__``: nothing imports them.

The reference's module names (``mneme.async_executor``, ``mneme.tuning.search_space``, ...) are not
modules of the core: the distribution declares them (``pyproject.toml``, entry points of the group
``mneme.reference_modules``) and :mod:`mneme._internal.reference_names` binds each to the module that
holds the code on first import, so no file under ``mneme/`` names a package above the core.

Inside ``replay_server`` the client (``replay_server.client``) and the server (``replay_server.server``)
share only the contract (``replay_server.protocol``) and the modules at the package's root. Every import
counts, the ones inside functions too; those under ``if TYPE_CHECKING:`` never run and do not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("mneme", "record_agent", "replay_server", "tuner")
ENTRY_POINTS = ("mneme.cli", "mneme.__main__", "replay_server.__main__")


def _under(module: str, prefixes: tuple[str, ...] | str) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(module: str, path: Path) -> set[str]:
    """The project's modules ``module`` imports anywhere in its body (the module, or the package whose
    attribute it takes)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:  # `import a.b.c` of a module: the deepest that is ours
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
            else:
                stack.append(child)


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def layer(module: str) -> int:
    if _under(module, ENTRY_POINTS):
        return 3
    if _under(module, "tuner"):
        return 2
    if _under(module, ("record_agent", "replay_server")):
        return 1
    return 0


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that breaks a rule of this module's docstring, as 'a -> b: why'."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            why = None
            if _under(target, ENTRY_POINTS) and not _under(module, ("mneme.cli", "mneme.__main__")):
                why = "nothing imports an entry point (the command line)"
            elif layer(target) > layer(module):
                why = f"an upward import (layer {layer(module)} -> {layer(target)})"
            elif {module.split(".")[0], target.split(".")[0]} == {"record_agent", "replay_server"}:
                why = "the record agent and the replay servers do not import each other"
            elif _under(module, "replay_server.client") and _under(target, "replay_server.server"):
                why = "the client never imports the server's internals"
            elif _under(module, "replay_server.server") and _under(target, "replay_server.client"):
                why = "the server never imports the client"
            if why:
                found.append(f"{module} -> {target}: {why}")
    return found


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, as the modules along it, or None."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path + [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [node])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return None


def test_imports_point_down_the_layers():
    assert violations(GRAPH) == []


def test_no_import_cycle_even_through_function_level_imports():
    found = cycle(GRAPH)
    assert found is None, f"import cycle: {' -> '.join(found)}"


def test_the_engine_interface_does_not_import_its_implementation():
    assert "replay_server.server.cuda_engine" not in GRAPH["replay_server.server.engine"]


@pytest.mark.parametrize("graph, expected", [
    ({"mneme.format.x": {"tuner.run"}}, "upward"),
    ({"mneme.store.x": {"mneme.cli.tune"}}, "entry point"),
    ({"tuner.run": {"mneme.cli.tune"}}, "entry point"),
    ({"mneme.async_executor": {"replay_server.client.executor"}}, "upward"),
    ({"mneme.tuning.search_space": {"tuner.space.search_space"}}, "upward"),
    ({"record_agent.session": {"replay_server.discovery"}}, "do not import each other"),
    ({"replay_server.client.executor": {"replay_server.server.service"}}, "server's internals"),
    ({"replay_server.server.serve": {"replay_server.client.executor"}}, "never imports the client"),
])
def test_the_rules_catch_what_they_forbid(graph, expected):
    (found,) = violations(graph)
    assert expected in found


def test_the_cycle_check_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from mneme.errors import MnemeError\n    from . import errors\n"
                      "if TYPE_CHECKING:\n    import tuner.run\n")
    assert _imports("mneme.x", source) == {"mneme.errors"}


def test_no_module_of_the_core_imports_a_package_above_it():
    upward = sorted(f"{m} -> {t}" for m, targets in GRAPH.items() if layer(m) == 0 for t in targets if layer(t) > 0)
    assert upward == []
    assert all(layer(m) == 0 for m in MODULES if _under(m, "mneme") and not _under(m, ("mneme.cli", "mneme.__main__")))

