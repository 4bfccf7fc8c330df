"""Read the ``# expect: slug`` marks of a fixture script (DESIGN §7).

``# expect: a, b`` — two findings on that line; ``# expect: a|b`` — either one.
``# graddoctor-args: --steps 4`` anywhere in the file — extra CLI options for that fixture.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

MARK = re.compile(r"#\s*expect:\s*([\w\-|, ]+)")
ARGS = re.compile(r"#\s*graddoctor-args:\s*(.+)$")


@dataclass(frozen=True)
class Expectation:
    line: int
    alternatives: frozenset[str]  # any one of these slugs satisfies it


def read_marks(path: str) -> tuple[list[Expectation], list[str]]:
    expectations: list[Expectation] = []
    args: list[str] = []
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            mark = MARK.search(text)
            if mark:
                for group in mark.group(1).split(","):
                    slugs = frozenset(s.strip() for s in group.split("|") if s.strip())
                    if slugs:
                        expectations.append(Expectation(number, slugs))
            extra = ARGS.search(text)
            if extra:
                args.extend(shlex.split(extra.group(1)))
    return expectations, args


def compare(expectations: list[Expectation], findings: list[tuple[int, str, str]]) -> list[str]:
    """Problems between marks and findings ``(line, slug, severity)``; [] when they agree.

    Every mark must be met by a finding at its line; every error or warning must be marked.
    Unmarked ``info`` findings are allowed (clean fixtures expect no error/warning).
    """
    problems = []
    for exp in expectations:
        if not any(line == exp.line and slug in exp.alternatives for line, slug, _ in findings):
            problems.append(f"line {exp.line}: expected {'|'.join(sorted(exp.alternatives))}, not reported")
    for line, slug, severity in findings:
        if severity == "info":
            continue
        if not any(exp.line == line and slug in exp.alternatives for exp in expectations):
            problems.append(f"line {line}: unexpected {severity} {slug}")
    return problems
