"""Applying findings' edits to text (``findings.Edit``), pure text: which fixes go together
(overlapping ones do not), the new text, where an old line lands, and the unified diff.
No torch, no libcst: the edits were built by the rules (rules/source.py); the run side
verifies and writes them (run/fixes.py)."""

from __future__ import annotations

import difflib
from typing import Iterable, Sequence

from .findings import Edit, Finding, Safety


def _offset(lines: Sequence[str], line: int, col: int) -> int:
    return sum(len(t) for t in lines[:line - 1]) + col


def apply_edits(text: str, edits: Iterable[Edit]) -> str:
    """``text`` with every edit made (they must not overlap; insertions at one point keep
    their order)."""
    lines = text.splitlines(keepends=True)
    spans = sorted(((_offset(lines, e.line, e.col), _offset(lines, e.end_line, e.end_col), i, e)
                    for i, e in enumerate(edits)), key=lambda t: (t[0], t[1], t[2]))
    out, at = [], 0
    for start, end, _, e in spans:
        out.append(text[at:start])
        out.append(e.text)
        at = max(at, end)
    out.append(text[at:])
    return "".join(out)


def _overlaps(a: Edit, b: Edit) -> bool:
    a0, a1 = (a.line, a.col), (a.end_line, a.end_col)
    b0, b1 = (b.line, b.col), (b.end_line, b.end_col)
    if a0 == a1 or b0 == b1:  # an insertion clashes only inside the other's replaced text
        point, (s, e) = (a0, (b0, b1)) if a0 == a1 else (b0, (a0, a1))
        return s < point < e
    return a0 < b1 and b0 < a1


def fixable(findings: Iterable[Finding], *, unsafe: bool = False,
            verified_only: bool = False) -> list[Finding]:
    """The findings whose edits go in together: not suppressed, of the safety asked, verified
    when asked, and none overlapping an earlier one (the first finding wins; ruff applies the
    rest in another pass, graddoctor leaves them to the next check)."""
    chosen: list[Finding] = []
    taken: list[Edit] = []
    for f in findings:
        fix = f.autofix
        if fix is None or not fix.edits or f.suppressed:
            continue
        if fix.safety is Safety.UNSAFE and not unsafe:
            continue
        if verified_only and not fix.verified:
            continue
        if any(_overlaps(e, t) for e in fix.edits for t in taken if e.path == t.path):
            continue
        chosen.append(f)
        taken.extend(fix.edits)
    return chosen


def edits_by_path(findings: Iterable[Finding]) -> dict[str, list[Edit]]:
    out: dict[str, list[Edit]] = {}
    for f in findings:
        for e in f.autofix.edits:
            out.setdefault(e.path, []).append(e)
    return out


def line_map(edits: Iterable[Edit], old_text: str | None = None):
    """old line -> its line in the edited text (None when the edits removed or rewrote it).
    With ``old_text``, a statement the edits move (its lines deleted and inserted elsewhere,
    re-indented) maps to where it landed."""
    edits = list(edits)

    def shifted(old: int) -> int | None:
        shift = 0
        for e in edits:
            added = e.text.count("\n") - (e.end_line - e.line)
            if e.end_line < old or (e.end_line == old and e.end_col == 0 and e.line < old):
                shift += added  # wholly above the line
            elif e.line == e.end_line == old and e.col == e.end_col == 0:
                shift += added  # lines inserted before it
            elif e.line < old or (e.line == old and e.end_line > old and e.col == 0):
                return None  # inside a replaced range, or deleted
        return old + shift

    moved: dict[int, int] = {}
    if old_text is not None:
        lines = old_text.splitlines()
        for d in edits:
            if d.text or d.col or d.end_col or d.end_line <= d.line:
                continue  # not a deletion of whole lines
            gone = [ln.strip() for ln in lines[d.line - 1:d.end_line - 1]]
            for i in edits:
                if i.line == i.end_line and i.col == i.end_col == 0 and \
                        [t.strip() for t in i.text.splitlines()][-len(gone):] == gone:
                    at = shifted(i.line) if i.line <= len(lines) else None
                    if at is None:  # inserted at the very end
                        at = len(lines) + sum(e.text.count("\n") - (e.end_line - e.line) for e in edits) \
                            - i.text.count("\n") + 1
                    else:
                        at -= i.text.count("\n")
                    first = at + i.text.count("\n") - len(gone)
                    for k in range(len(gone)):
                        moved[d.line + k] = first + k
                    break

    def new_line(old: int) -> int | None:
        return moved[old] if old in moved else shifted(old)

    return new_line


def unified_diff(path: str, old: str, new: str, marks: Sequence[tuple[range, str]] = ()) -> str:
    """The diff of one file, as ``git diff`` prints it; each hunk's header ends with the marks
    whose old lines it touches (``marks``: (old lines, text), e.g. "GD101 verified")."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    for lines in (a, b):
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n\\ No newline at end of file\n"
    out = []
    for text in difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", n=3):
        if text.startswith("@@") and marks:
            start, _, count = text.split()[1][1:].partition(",")
            first, n = int(start), int(count or 1)
            hunk = range(first, first + max(n, 1))
            notes = [m for r, m in marks if any(line in hunk for line in r)]
            if notes:
                text = text.rstrip("\n") + "  " + "; ".join(dict.fromkeys(notes)) + "\n"
        out.append(text)
    return "".join(out)
