"""The import arrows of docs/architecture.md, read from the source with `ast`."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.support.corpus import REPO

PACKAGES = ("wire", "store", "engine", "session", "server", "loadgen")
# What each package may import of the project (besides itself).
ALLOWED: dict[str, frozenset[str]] = {
    "wire": frozenset(),
    "store": frozenset({"wire"}),
    "engine": frozenset(),
    "session": frozenset({"engine", "store", "wire"}),
    "server": frozenset({"session", "store", "engine", "wire"}),
    "loadgen": frozenset({"wire"}),
}
ENGINE_API = "engine.api"  # the one module of the engine that session/ sees
MAX_MODULE_LINES = 450  # one concept per module (docs/architecture.md)
# A module may pass MAX_MODULE_LINES when it says why, on a line of its own near the top:
# `# One concept, N lines: <why it does not split>`. The size is a guide, not a wall.
SIZE_REASON = "# One concept, "


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {
    module_name(path): path for package in PACKAGES for path in (REPO / package).rglob("*.py")
}


def imported(name: str) -> Iterator[tuple[int, str]]:
    """(line, module) for every project module `name` imports, at any depth of its code
    (lazy imports in functions count). `from pkg import mod` names the submodule."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            submodules = [f"{base}.{alias.name}" for alias in node.names]
            targets = [base, *(m for m in submodules if m in MODULES)]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES:
                yield node.lineno, target


def test_parts_import_only_along_the_arrows() -> None:
    """wire and engine import no other part; store only wire; session engine, store and
    wire; loadgen only wire; nothing imports server."""
    wrong = []
    for name in sorted(MODULES):
        part = name.split(".")[0]
        for line, target in imported(name):
            other = target.split(".")[0]
            if other != part and other not in ALLOWED[part]:
                wrong.append(f"{MODULES[name].relative_to(REPO)}:{line} imports {target}")
    assert not wrong, "imports against the arrows of docs/architecture.md:\n" + "\n".join(wrong)


def test_session_sees_only_the_engine_api() -> None:
    """session/ uses the engine through engine/api.py alone (not the scheduler or Whisper)."""
    wrong = [
        f"{MODULES[name].relative_to(REPO)}:{line} imports {target}"
        for name in sorted(MODULES)
        if name.startswith("session")
        for line, target in imported(name)
        if target.split(".")[0] == "engine" and target != ENGINE_API
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle() -> None:
    """No module of the project imports itself back through others (Tarjan's SCCs)."""
    graph = {
        name: sorted({t for _, t in imported(name) if t in MODULES and t != name})
        for name in MODULES
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the module count
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    assert not cycles, f"import cycles: {cycles}"


def size_reason(path: Path) -> str | None:
    """The module's stated reason for its size, among its first 40 lines (None: none)."""
    head = path.read_text().splitlines()[:40]
    return next((line for line in head if line.startswith(SIZE_REASON)), None)


def test_every_module_stays_small() -> None:
    """Every module of the parts is at most MAX_MODULE_LINES lines, or says in a line of
    its own why it is one concept all the same: one that grows past it without a reason
    holds more than one concept and is split along them."""
    long = [
        f"{path.relative_to(REPO)}: {lines} lines"
        for _, path in sorted(MODULES.items())
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
        and size_reason(path) is None
    ]
    assert not long, (
        f"modules over {MAX_MODULE_LINES} lines with no `{SIZE_REASON}...` line:\n"
        + "\n".join(long)
    )


def test_the_walk_sees_every_import_form() -> None:
    """A guard on the guard: every part has modules, and `from wire import build` counts
    as an import of wire.build."""
    assert {name.split(".")[0] for name in MODULES} == set(PACKAGES)
    assert {"wire.build", "engine.api"} <= {t for _, t in imported("session.actor")}
