"""The package's imports flow one way: no cycle, and no import against the layer order written in
docs/architecture.md ("Layers"). Read from the source with ``ast``, nothing is imported.

Every import counts, at module level or inside a function (a lazy import is still a
dependency); only those under ``if TYPE_CHECKING:`` are left out (they never run).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "graddoctor"
DOC = ROOT / "docs" / "architecture.md"

@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (the package itself for ``from pkg import name``)
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({_path(self.source)}:{self.line})"


def _modules() -> dict[str, tuple[Path, bool]]:
    """graddoctor.x.y -> (its file, whether it is a package's __init__)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


MODULES = _modules()


def _path(module: str) -> str:
    return str(MODULES[module][0].relative_to(ROOT))


def _known(name: str) -> str | None:
    """The innermost module of the package that ``name`` lies in (``pkg.mod.attr`` -> pkg.mod)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports_of(module: str) -> set[Import]:
    path, is_package = MODULES[module]
    here = module.split(".") if is_package else module.split(".")[:-1]
    found: set[Import] = set()

    def targets(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        if node.level:  # relative: from . / .. / .x import y
            base = here[:len(here) - node.level + 1]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module
        # ``from pkg import mod`` depends on pkg.mod; ``from mod import name`` on mod
        return [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in MODULES else origin
                for alias in node.names]

    def visit(node) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit_statement(other)
                continue
            visit_statement(child)

    def visit_statement(node) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in targets(node):
                target = _known(name) if name.split(".")[0] == "graddoctor" else None
                if target is not None and target != module:
                    found.add(Import(module, target, node.lineno))
        visit(node)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return found


@functools.cache
def _all_imports() -> list[Import]:
    """Every import of the package, read when a test first asks (not at collection: every xdist
    worker collects this module, one runs its tests)."""
    return sorted({i for m in MODULES for i in _imports_of(m)},
                  key=lambda i: (i.source, i.target, i.line))


def _layers() -> list[tuple[str, list[str]]]:
    """The floors of docs/architecture.md's ``layers`` block, bottom first: (name, entries)."""
    text = DOC.read_text(encoding="utf-8")
    block = re.search(r"^```layers\n(.*?)^```", text, re.S | re.M)
    assert block, f"{DOC.relative_to(ROOT)} has no ```layers block"
    floors = []
    for line in block.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, entries = line.partition(":")
            floors.append((name.strip(), entries.split()))
    return floors


def _entry_holds(entry: str, module: str) -> bool:
    """``x`` is graddoctor.x, ``x/`` the package graddoctor.x and all it holds, ``__init__`` the
    top package itself."""
    if entry == "__init__":
        return module == "graddoctor"
    name = "graddoctor." + entry.rstrip("/").replace("/", ".")
    return module == name or (entry.endswith("/") and module.startswith(name + "."))


def _floor_of() -> tuple[dict[str, int], list[str]]:
    floors = _layers()
    where: dict[str, int] = {}
    problems = []
    for module in MODULES:
        holding = [n for n, (_, entries) in enumerate(floors)
                   if any(_entry_holds(e, module) for e in entries)]
        if len(holding) != 1:
            problems.append(f"{_path(module)}: on {len(holding)} floors "
                            f"({', '.join(floors[n][0] for n in holding) or 'none'}), needs one")
        else:
            where[module] = holding[0]
    return where, problems


def _a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := walk(start)):
            return found
    return None


def test_every_module_is_on_one_floor_of_the_architecture_doc():
    _, problems = _floor_of()
    assert not problems, ("place each module on one floor of the ```layers block in "
                          "docs/architecture.md:\n" + "\n".join(problems))


def test_no_import_goes_up_the_layers():
    floor, _ = _floor_of()
    names = [name for name, _ in _layers()]
    upward = [f"{i}: {names[floor[i.source]]} imports {names[floor[i.target]]}"
              for i in _all_imports() if i.source in floor and i.target in floor
              and floor[i.target] > floor[i.source]]
    assert not upward, ("a module may import only its own floor or those below "
                        "(docs/architecture.md, Layers):\n" + "\n".join(upward))


def test_the_import_graph_has_no_cycle():
    graph: dict[str, set[str]] = {}
    for i in _all_imports():
        graph.setdefault(i.source, set()).add(i.target)
    cycle = _a_cycle(graph)
    if cycle is not None:
        lines = {(i.source, i.target): i for i in reversed(_all_imports())}  # the first line of each
        raise AssertionError("import cycle:\n" + "\n".join(
            str(lines[a, b]) for a, b in zip(cycle, cycle[1:])))


def test_the_graph_sees_lazy_relative_and_type_checking_imports(tmp_path, monkeypatch):
    """The reader itself: a function-level relative import counts, a TYPE_CHECKING one does not."""
    package = tmp_path / "graddoctor"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("")
    (package / "high.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .. import low\n")
    (package / "sub" / "mod.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..high import X\n"
        "def f():\n    from ..high import Y\n    from . import other\n"
        "import graddoctor.low.attr\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGE", package)
    monkeypatch.setitem(globals(), "MODULES", _modules())
    assert {(i.target, i.line) for i in _imports_of("graddoctor.sub.mod")} == {
        ("graddoctor.high", 5), ("graddoctor.sub", 6), ("graddoctor.low", 7)}
    assert {i.target for i in _imports_of("graddoctor.sub")} == {"graddoctor.low"}
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _a_cycle({"a": {"b"}, "b": set()}) is None
