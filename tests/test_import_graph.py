"""The package's imports run one way: server -> engine -> contract <- models; agent is used by server only.

Read with `ast` (lazy imports inside functions count too), so a cycle fails here before it can fail at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "streamvox"
# Which top-level parts of the package each part may import (besides itself).
ALLOWED = {
    "contract": set(),
    "settings": set(),
    "text_split": set(),
    "audio": set(),
    "models": {"contract", "settings", "text_split", "audio"},
    "engine": {"contract", "settings", "audio", "models"},
    "agent": {"contract", "settings", "audio"},
    "server": {"contract", "settings", "text_split", "audio", "engine", "agent"},
    "scale": {"contract", "settings", "audio", "engine", "server"},
    "cli": {"contract", "settings", "audio", "engine", "models", "server", "scale"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> set[str]:
    """Every `streamvox.*` module `path` imports, at any depth of its code."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] == "streamvox"}


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for module, path in modules.items():
        # `from a.b import c` names module a.b.c when c is a module, else a.b.
        graph[module] = {name for name in _imports(path, module) if name in modules and name != module}
    return graph


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "streamvox"


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_imports_run_one_way():
    wrong = []
    for module, targets in sorted(_graph().items()):
        part = _part(module)
        if part == "streamvox":  # the package's own __init__
            continue
        allowed = ALLOWED.get(part)
        assert allowed is not None, f"{module}: top-level part {part!r} has no rule in ALLOWED"
        wrong += [f"{module} imports {target}" for target in sorted(targets)
                  if _part(target) not in allowed | {part, "streamvox"}]
    assert not wrong, "imports against the layout:\n" + "\n".join(wrong)


def test_the_checker_sees_lazy_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from streamvox.server import app\n    import streamvox.engine.core\n")
    assert _imports(source, "streamvox.models.m") == {"streamvox.server", "streamvox.server.app",
                                                      "streamvox.engine.core"}
