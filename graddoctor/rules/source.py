"""The user's source as the fix builders see it (``Rule.autofix``): a file parsed once with
libcst, its statements with their line ranges and enclosing blocks, and the edits the fixes are
made of (``findings.Edit``). libcst keeps every space and comment, so an edit touches only the
text it replaces; a moved statement keeps its own line, comment included, re-indented.

libcst is the ``graddoctor[fix]`` extra: without it ``load`` returns None and findings carry no
edit (the text fix is unchanged).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Iterator

from ..findings import Edit, Role
from ..notebook import is_notebook


@dataclass(eq=False)
class Stmt:
    """One statement: a simple one (one line of ``;``-joined small statements) or a compound
    one (``for``, ``if``, ``def``, ``with``...), its lines and the statement it sits in."""

    node: object  # the libcst node
    line: int
    end_line: int
    parent: "Stmt | None"
    syntax: str  # the libcst class name: SimpleStatementLine, For, While, If, FunctionDef...
    children: list["Stmt"] = field(default_factory=list)  # the statements of its body (and else)
    block: int = 0  # which block of its parent it sits in (0: the body, then else, handlers...)

    def ancestors(self) -> Iterator["Stmt"]:
        s = self.parent
        while s is not None:
            yield s
            s = s.parent

    def contains(self, line: int) -> bool:
        return self.line <= line <= self.end_line

    @property
    def is_loop(self) -> bool:
        return self.syntax in ("For", "While")


class Source:
    """One file of the user's code, read when the fixes are built; ``digest`` names that text
    so that nothing is written into a file changed since."""

    def __init__(self, path: str, full_path: str, text: str):
        import warnings

        import libcst as cst

        with warnings.catch_warnings():  # libcst 1.0's metadata package warns about mypy_extensions
            warnings.simplefilter("ignore", DeprecationWarning)
            from libcst.metadata import MetadataWrapper, PositionProvider

        self.path, self.full_path, self.text = path, full_path, text
        self.lines = text.splitlines(keepends=True)
        self.digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        self.cst = cst
        wrapper = MetadataWrapper(cst.parse_module(text), unsafe_skip_copy=True)
        self.module = wrapper.module
        self.positions = wrapper.resolve(PositionProvider)
        self.statements: list[Stmt] = []
        self._index(self.module.body, None, 0)

    # -- the statement tree ----------------------------------------------------------------

    def _index(self, body, parent: Stmt | None, block: int) -> None:
        cst = self.cst
        for node in body:
            pos = self.positions[node]
            s = Stmt(node, pos.start.line, pos.end.line, parent, type(node).__name__, block=block)
            if isinstance(node, cst.SimpleStatementLine):
                s.line = self.positions[node.body[0]].start.line  # past leading comment lines
            else:
                s.line = self._header_line(node)
            self.statements.append(s)
            if parent is not None:
                parent.children.append(s)
            for number, inner in enumerate(self._blocks(node)):
                self._index(inner, s, number)

    def _header_line(self, node) -> int:
        """A compound statement's first line (its first decorator's, if any)."""
        for attr in ("decorators",):
            if getattr(node, attr, None):
                return self.positions[node.decorators[0]].start.line
        return self.positions[node].start.line  # libcst's positions leave leading lines out

    def _blocks(self, node):
        cst = self.cst
        out = []
        body = getattr(node, "body", None)
        if isinstance(body, cst.IndentedBlock):
            out.append(body.body)
        orelse = getattr(node, "orelse", None)
        while orelse is not None:
            if isinstance(orelse, cst.If):  # elif: its own If, indexed as a child
                out.append([orelse])
                break
            if isinstance(getattr(orelse, "body", None), cst.IndentedBlock):
                out.append(orelse.body.body)
            break
        for handler in getattr(node, "handlers", ()) or ():
            if isinstance(handler.body, cst.IndentedBlock):
                out.append(handler.body.body)
        final = getattr(node, "finalbody", None)
        if final is not None and isinstance(final.body, cst.IndentedBlock):
            out.append(final.body.body)
        return out

    def statement_at(self, line: int) -> Stmt | None:
        """The innermost simple statement whose lines hold ``line``."""
        best = None
        for s in self.statements:
            if s.syntax == "SimpleStatementLine" and s.contains(line):
                if best is None or s.line >= best.line:
                    best = s
        return best

    def siblings(self, s: Stmt) -> list[Stmt]:
        """The statements of the block ``s`` sits in (the module's top level for None)."""
        if s.parent is None:
            return [t for t in self.statements if t.parent is None]
        return [t for t in s.parent.children if self._same_block(t, s)]

    @staticmethod
    def _same_block(a: Stmt, b: Stmt) -> bool:
        return a.parent is b.parent and a.block == b.block

    def enclosing_loop(self, s: Stmt) -> Stmt | None:
        for a in s.ancestors():
            if a.syntax == "FunctionDef":
                return None
            if a.is_loop:
                return a
        return None

    def enclosing_function(self, s: Stmt) -> Stmt | None:
        for a in s.ancestors():
            if a.syntax == "FunctionDef":
                return a
        return None

    # -- text ----------------------------------------------------------------------------

    def line_text(self, line: int) -> str:
        return self.lines[line - 1] if 0 < line <= len(self.lines) else ""

    def indent(self, s: Stmt) -> str:
        text = self.line_text(s.line)
        return text[:len(text) - len(text.lstrip())]

    def code(self, node) -> str:
        return self.module.code_for_node(node)

    def stmt_lines(self, s: Stmt) -> list[str]:
        """The statement's own lines, its indentation removed (its comments kept)."""
        ind = len(self.indent(s))
        out = []
        for n in range(s.line, s.end_line + 1):
            text = self.line_text(n)
            out.append(text[ind:] if text[:ind].strip() == "" else text.lstrip())
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        return out

    def only_statement(self, s: Stmt) -> bool:
        """``s`` is alone in its block (deleting it would leave the block empty)."""
        return s.parent is not None and sum(1 for t in s.parent.children
                                            if self._same_block(t, s)) == 1

    # -- nodes ---------------------------------------------------------------------------

    def nodes(self, kind, line: int | None = None, within: Stmt | None = None) -> list:
        """Every libcst node of class ``kind`` (in source order) that starts on ``line`` or lies
        in statement ``within``."""
        found = []
        cst = self.cst
        positions = self.positions

        class Visit(cst.CSTVisitor):
            def on_visit(self, node):
                if isinstance(node, kind):
                    pos = positions.get(node)
                    if pos is not None and (line is None or pos.start.line == line):
                        found.append(node)
                return True

        root = within.node if within is not None else self.module
        root.visit(Visit())
        return found

    def span(self, node) -> tuple[int, int, int, int]:
        pos = self.positions[node]
        return pos.start.line, pos.start.column, pos.end.line, pos.end.column

    # -- edits ---------------------------------------------------------------------------

    def replace(self, node, text: str) -> Edit:
        line, col, end_line, end_col = self.span(node)
        return Edit(self.path, line, col, end_line, end_col, text)

    def insert_before(self, s: Stmt, lines: list[str] | str, indent: str | None = None) -> Edit:
        ind = self.indent(s) if indent is None else indent
        return Edit(self.path, s.line, 0, s.line, 0, _indented(lines, ind))

    def insert_after(self, s: Stmt, lines: list[str] | str, indent: str | None = None) -> Edit:
        ind = self.indent(s) if indent is None else indent
        at = s.end_line + 1
        text = _indented(lines, ind)
        last = self.line_text(s.end_line)
        if at > len(self.lines) and not last.endswith("\n"):  # a last line without its newline
            return Edit(self.path, s.end_line, len(last), s.end_line, len(last), "\n" + text)
        return Edit(self.path, at, 0, at, 0, text)

    def delete(self, s: Stmt) -> Edit:
        end = s.end_line + 1
        last = self.line_text(s.end_line)
        if end > len(self.lines) and not last.endswith("\n"):  # a last line without its newline
            return Edit(self.path, s.line, 0, s.end_line, len(last), "")
        return Edit(self.path, s.line, 0, end, 0, "")


def _indented(lines: list[str] | str, indent: str) -> str:
    if isinstance(lines, str):
        lines = [lines if lines.endswith("\n") else lines + "\n"]
    return "".join(indent + ln if ln.strip() else ln for ln in lines)


_CACHE: dict[tuple, "Source | None"] = {}


def load(path: str, base_dir: str | None = None) -> Source | None:
    """The file a finding points at, parsed; None when it cannot be edited by graddoctor (a
    notebook, a file not on disk, code libcst cannot parse, libcst not installed)."""
    if is_notebook(path) or path.startswith("<"):
        return None
    full = path if os.path.isabs(path) else os.path.join(base_dir or os.getcwd(), path)
    try:
        stat = os.stat(full)
    except OSError:
        return None
    key = (full, stat.st_mtime_ns, stat.st_size, path)
    if key not in _CACHE:
        try:
            import libcst  # noqa: F401
        except ImportError:
            return None
        try:
            with open(full, encoding="utf-8", newline="") as f:
                text = f.read()
            _CACHE[key] = Source(path, full, text)
        except Exception:  # a file libcst cannot parse: no edit, the text fix stands
            _CACHE[key] = None
        if len(_CACHE) > 64:
            _CACHE.pop(next(iter(_CACHE)))
    return _CACHE[key]


# -- what the fix builders look for ---------------------------------------------------------

def method_calls(src: Source, method: str, line: int | None = None, within: Stmt | None = None):
    """``X.method(...)`` calls (libcst ``Call`` nodes) on ``line`` or in ``within``."""
    cst = src.cst
    return [c for c in src.nodes(cst.Call, line=line, within=within)
            if isinstance(c.func, cst.Attribute) and c.func.attr.value == method]


def calls_in(src: Source, node, method: str):
    """``X.method(...)`` calls inside any libcst node (a ``with`` item, an expression)."""
    cst = src.cst
    found = []

    class Visit(cst.CSTVisitor):
        def visit_Call(self, c):
            if isinstance(c.func, cst.Attribute) and c.func.attr.value == method:
                found.append(c)

    node.visit(Visit())
    return found


def receiver(src: Source, call) -> str:
    """The code of ``X`` in ``X.method(...)``."""
    return src.code(call.func.value)


def related_line(finding, *roles: Role) -> int | None:
    """The line of the finding's first related location, in the finding's file, that has one
    of ``roles`` (never found by the wording of a note: rewording one must not move an edit)."""
    if not all(isinstance(role, Role) for role in roles):
        raise TypeError(f"related_line takes roles (findings.Role), not {roles!r}")
    for r in finding.related:
        if r.location.path == finding.location.path and any(role in r.roles for role in roles):
            return r.location.line
    return None


def stepped_optimizer(src: Source, line: int) -> str | None:
    """The optimizer a step at ``line`` steps: ``opt`` in ``opt.step()`` and in
    ``scaler.step(opt)``."""
    s = src.statement_at(line)
    for call in method_calls(src, "step", within=s) if s is not None else ():
        name = receiver(src, call)
        if call.args and "scaler" in name.lower():
            return src.code(call.args[0].value)
        return name
    return None


def call_bare_method(src: Source, line: int, names: tuple[str, ...]):
    """The edit that calls a method a statement only names (``optimizer.zero_grad`` ->
    ``optimizer.zero_grad()``), or None when the statement at ``line`` is not such a name."""
    cst = src.cst
    s = src.statement_at(line)
    if s is None or len(s.node.body) != 1 or not isinstance(s.node.body[0], cst.Expr):
        return None
    value = s.node.body[0].value
    if not isinstance(value, cst.Attribute) or value.attr.value not in names:
        return None
    _, _, end_line, end_col = src.span(value)
    return Edit(src.path, end_line, end_col, end_line, end_col, "()")


def move_after(src: Source, s: Stmt, target: Stmt, indent: str | None = None) -> list[Edit] | None:
    """Delete statement ``s`` and put its own lines (comments kept) after ``target``; None when
    ``s`` is alone in its block or shares its line with other statements."""
    if src.only_statement(s) or len(getattr(s.node, "body", ())) != 1:
        return None
    return [src.delete(s), src.insert_after(target, src.stmt_lines(s),
                                            indent=src.indent(target) if indent is None else indent)]


def attribute_assignment(src: Source, line: int, attribute: str):
    """The ``X.attribute = value`` (or annotated) assignment starting on ``line``, as libcst
    nodes ``(statement, target, value)``; None when the line holds no such single-target one."""
    cst = src.cst
    for node in src.nodes((cst.Assign, cst.AnnAssign), line=line):
        if isinstance(node, cst.Assign):
            if len(node.targets) != 1:
                continue
            target = node.targets[0].target
        else:
            target = node.target
        if (isinstance(target, cst.Attribute) and target.attr.value == attribute
                and node.value is not None):
            return node, target, node.value
    return None


def torch_nn(src: Source) -> str | None:
    """How the file names ``torch.nn`` at module level (``nn`` after ``from torch import nn``,
    ``torch.nn`` after ``import torch``), or None when it imports neither."""
    cst = src.cst
    plain_torch = False
    for node in src.nodes((cst.Import, cst.ImportFrom)):
        if isinstance(node, cst.ImportFrom) and src.code(node.module or cst.Name("")) == "torch" \
                and not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                if src.code(alias.name) == "nn":
                    return src.code(alias.asname.name) if alias.asname else "nn"
        elif isinstance(node, cst.Import):
            for alias in node.names:
                name = src.code(alias.name)
                if name == "torch.nn" and alias.asname:
                    return src.code(alias.asname.name)
                if name in ("torch", "torch.nn") and not alias.asname:
                    plain_torch = True
    return "torch.nn" if plain_torch else None
