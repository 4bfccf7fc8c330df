"""Read the marks of a fixture script (docs/architecture.md, "Fixture marks") and compare them
with what a check found.

``# expect: slug`` — a finding of that rule at that line, at the rule's default severity
(``graddoctor.rules.find_rule(slug).severity``); ``# expect: slug(info)`` — at another
severity; ``# expect: a, b`` — two findings on that line; ``# expect: a|b(info)`` — either one.
``# graddoctor-args: --steps 4`` anywhere in the file — extra CLI options for that fixture.
``# silent: slug-a, slug-b`` on a line of its own (a good fixture's last lines) — the rules this
good fixture is the clean look-alike for: none of them may report anything on it.
``# watch: always`` on a line of its own — also run this fixture under ``graddoctor.watch()``
(tests/watch_parity.py), whatever the subset holds otherwise.

Bad fixtures (``bad_*.py``) must get every mark met and no unmarked warning or error; an
unmarked ``info`` is tolerated there (a buggy loop may well earn a side remark). Good fixtures
(``good_*.py``) are strict, as pylint's functional tests are: every finding, ``info`` included,
must meet a mark, and their declared rules report nothing at all. An ``info`` a good fixture is
meant to get is marked like any other, with a comment saying why.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from graddoctor.rules import find_rule

MARK = re.compile(r"#\s*expect:\s*([\w\-|, ()]+)")
ARGS = re.compile(r"#\s*graddoctor-args:\s*(.+)$")
SILENT = re.compile(r"^#\s*silent:\s*(.*?)\s*$")
ALTERNATIVE = re.compile(r"^([\w\-]+)\s*(?:\(\s*(info|warning|error)\s*\))?$")
SEVERITIES = ("info", "warning", "error")


@dataclass(frozen=True)
class Expectation:
    line: int
    alternatives: frozenset[tuple[str, str]]  # (slug, severity); any one of these satisfies it

    def __str__(self) -> str:
        return "|".join(f"{slug}({severity})" for slug, severity in sorted(self.alternatives))


@dataclass(frozen=True)
class Seen:
    """A finding as the harness compares it: where (``path``/``line`` None when the finding
    has no location), which rule, how severe."""
    path: str | None
    line: int | None
    slug: str
    severity: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.path is not None else "(no location)"
        return f"{self.severity} {self.slug} at {where}"


def parse_alternative(text: str) -> tuple[str, str]:
    """``slug`` or ``slug(severity)`` -> (slug, severity); the rule must exist."""
    match = ALTERNATIVE.match(text.strip())
    if not match:
        raise ValueError(f"bad expect mark {text!r}: write slug or slug(info|warning|error)")
    slug, severity = match.groups()
    rule = find_rule(slug)
    if rule is None or rule.slug != slug:
        raise ValueError(f"expect mark {text!r}: no rule has the slug {slug!r}")
    return slug, severity or rule.severity.value


def parse_mark(line: int, text: str) -> list[Expectation]:
    expectations = []
    for group in text.split(","):
        alternatives = [a for a in group.split("|") if a.strip()]
        if alternatives:
            expectations.append(Expectation(line, frozenset(map(parse_alternative, alternatives))))
    return expectations


def read_marks(path: str) -> tuple[list[Expectation], list[str]]:
    expectations: list[Expectation] = []
    args: list[str] = []
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            mark = MARK.search(text)
            if mark:
                expectations.extend(parse_mark(number, mark.group(1)))
            extra = ARGS.search(text)
            if extra:
                args.extend(shlex.split(extra.group(1)))
    return expectations, args


def read_silent(path: str) -> set[str]:
    """The slugs a good fixture's ``# silent:`` lines declare (several lines add up)."""
    slugs: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            mark = SILENT.match(line.strip())
            if mark:
                slugs.update(s.strip() for s in mark.group(1).split(",") if s.strip())
    return slugs


def _meets(seen: Seen, exp: Expectation, path: str) -> bool:
    return seen.path == path and seen.line == exp.line and (seen.slug, seen.severity) in exp.alternatives


def compare(expectations: list[Expectation], findings: list[Seen], path: str,
            silent: set[str] | None = None) -> list[str]:
    """Problems between the marks of the fixture ``path`` and the findings of its check; []
    when they agree.

    Every mark must be met by a finding in ``path`` at its line, of one of its slugs at that
    slug's severity. Every finding at warning or above — in any file, with or without a
    location — must meet a mark. ``silent`` (a good fixture's declared rules; None for a bad
    fixture) makes it strict: ``info`` findings must meet a mark too, and a finding of a
    declared rule is a problem even where a mark names it.
    """
    strict = silent is not None
    problems = []
    if strict:
        for exp in expectations:
            both = sorted(silent & {slug for slug, _ in exp.alternatives})
            if both:
                problems.append(f"line {exp.line}: expects {', '.join(both)}, "
                                f"which the fixture declares silent")
    for exp in expectations:
        if not any(_meets(seen, exp, path) for seen in findings):
            near = [str(s) for s in findings if s.path == path and s.line == exp.line]
            problems.append(f"line {exp.line}: expected {exp}, not reported"
                            + (f" (reported there: {', '.join(near)})" if near else ""))
    for seen in findings:
        if seen.severity not in SEVERITIES:
            problems.append(f"unknown severity: {seen}")
        elif strict and seen.slug in silent:
            problems.append(f"declared silent, yet reported: {seen}")
        elif (strict or seen.severity != "info") \
                and not any(_meets(seen, exp, path) for exp in expectations):
            problems.append(f"unexpected {seen}")
    return problems
