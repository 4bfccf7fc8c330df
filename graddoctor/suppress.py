"""Inline suppressions: ``# graddoctor: ignore[slug]`` on the line a finding points at.

    optimizer.zero_grad()  # graddoctor: ignore[misplaced-zero-grad]
    loss.backward()        # graddoctor: ignore[GD101, stale-grad]   (slugs or code prefixes)
    model.eval()           # graddoctor: ignore                      (every rule on this line)

A suppressed finding is kept and marked, so the report can count it; it no longer affects the
exit code. Only real comments count (read with ``tokenize``), not text inside strings.
"""

from __future__ import annotations

import dataclasses
import io
import linecache
import os
import re
import tokenize
from typing import Iterable

from .findings import Finding
from .notebook import is_notebook, python_lines

DIRECTIVE = re.compile(r"#\s*graddoctor\s*:\s*ignore\b(?:\[([^\]]*)\])?", re.IGNORECASE)

ALL = None  # a bare ``ignore``: every rule


def _directives_in(comment: str) -> list[tuple[str, ...] | None]:
    found = []
    for match in DIRECTIVE.finditer(comment):
        inside = match.group(1)
        if inside is None:
            found.append(ALL)
        else:
            found.append(tuple(s.strip().lower() for s in inside.split(",") if s.strip()))
    return found


def read_directives(source: str) -> dict[int, list[tuple[str, ...] | None]]:
    """line -> the suppressions written in that line's comment."""
    out: dict[int, list] = {}
    if DIRECTIVE.search(source) is None:  # no comment can hold one: no need to tokenize
        return out
    try:
        comments = [(tok.start[0], tok.string)
                    for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                    if tok.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        # not tokenizable as a whole: fall back to the text after a '#' on each line
        comments = [(n, line[line.index("#"):]) for n, line in enumerate(source.splitlines(), 1)
                    if "#" in line]
    for line, text in comments:
        directives = _directives_in(text)
        if directives:
            out.setdefault(line, []).extend(directives)
    return out


def covers(directive: tuple[str, ...] | None, finding: Finding) -> bool:
    if directive is ALL:
        return True
    code = finding.code.lower()
    return any(sel == finding.rule or (sel.startswith("gd") and code.startswith(sel))
               for sel in directive)


class Suppressions:
    """Reads each source file once; ``is_suppressed(finding)`` looks at its reported line."""

    def __init__(self, base_dir: str | None = None):
        self.base_dir = base_dir or os.getcwd()
        self._files: dict[str, dict[int, list]] = {}

    def directives(self, path: str) -> dict[int, list]:
        """line -> the suppressions on that line of ``path`` (read once)."""
        return self._directives(path)

    def _directives(self, path: str) -> dict[int, list]:
        full = path if os.path.isabs(path) else os.path.join(self.base_dir, path)
        known = self._files.get(full)
        if known is None:
            try:
                if is_notebook(full):  # the code cells as they ran (line numbers: the file's)
                    known = read_directives("".join(python_lines(full) or []))
                elif (ran := linecache.cache.get(full)) is not None and ran[1] is None:
                    known = read_directives("".join(ran[2]))  # the text that ran (target.py)
                else:
                    with tokenize.open(full) as f:  # honours the file's encoding cookie
                        known = read_directives(f.read())
            except (OSError, SyntaxError, UnicodeDecodeError):
                known = {}
            self._files[full] = known
        return known

    def is_suppressed(self, finding: Finding) -> bool:
        loc = finding.location
        if loc is None:
            return False
        return any(covers(d, finding) for d in self._directives(loc.path).get(loc.line, ()))


def apply_suppressions(findings: Iterable[Finding], base_dir: str | None = None) -> list[Finding]:
    """The same findings, those with a matching ``# graddoctor: ignore`` marked suppressed."""
    table = Suppressions(base_dir)
    return [dataclasses.replace(f, suppressed=True) if not f.suppressed and table.is_suppressed(f)
            else f for f in findings]
