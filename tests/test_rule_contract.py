"""What adding a rule takes, enforced: one file in graddoctor/rules/, registered in ALL_RULES,
its unit tests in tests/test_rule_<slug>.py, a bad and a good fixture, its docs in four sections,
and the rules table of docs/rules.md regenerated.

Pure Python (no subprocess, no torch): the fixtures are read, not run (tests/test_fixtures.py
runs them). Every check is parametrised per rule, so a failure names it.

Fixture marks:

* a ``fixtures/**/bad_*.py`` covers a rule when one of its ``# expect: <slug>`` marks names it
  (each alternative of ``# expect: a|b`` counts; see tests/fixture_marks.py);
* a ``fixtures/**/good_*.py`` declares the rules it is the clean look-alike for — the patterns
  those rules must stay silent on — with a comment on its last lines::

      # silent: slug-a, slug-b

  (slugs only; several ``# silent:`` lines add up). It goes at the end of the file so that no
  line of the fixture moves. Every good fixture declares at least one rule; tests/test_fixtures.py
  runs it and fails on any finding of those rules, ``info`` included.
"""

from __future__ import annotations

import glob
import importlib
import inspect
import os
import pkgutil
import re

import pytest

import graddoctor.rules as rules_pkg
from conftest import FIXTURES, ROOT
from fixture_marks import read_marks, read_silent
from graddoctor.findings import Severity
from graddoctor.rules import ALL_RULES
from graddoctor.rules.base import Rule
from graddoctor.rules.docs import (architecture_table, readme_table, rules_table, silent_table,
                                   table_span, with_silent_table, with_table)

SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead")
CODE_SECTIONS = ("Example", "Use instead")
CODE_RE = re.compile(r"GD\d{3}")
SLUG_RE = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)+")
PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n.*?\S.*?^```[ \t]*$", re.S | re.M)

RULE_IDS = {"ids": lambda r: r.slug}


# --- the helpers: each returns the problems it finds ([] when the contract holds) -------------

def doc_problems(rule) -> list[str]:
    """The rule's attributes and its docstring's four sections."""
    problems = []
    for attr in ("code", "slug", "severity", "summary", "fix"):
        if not getattr(rule, attr, None):
            problems.append(f"no {attr}")
    code, slug = getattr(rule, "code", ""), getattr(rule, "slug", "")
    if code and not CODE_RE.fullmatch(code):
        problems.append(f"code {code!r} is not GD + 3 digits")
    if slug and not SLUG_RE.fullmatch(slug):
        problems.append(f"slug {slug!r} is not kebab-case")
    if getattr(rule, "severity", None) is not None and not isinstance(rule.severity, Severity):
        problems.append(f"severity {rule.severity!r} is not a Severity")
    summary = getattr(rule, "summary", "") or ""
    if "\n" in summary or summary != summary.strip():
        problems.append("summary is not one trimmed line")
    docs = rule.docs()
    for title in SECTIONS:
        if not re.search(rf"^## {re.escape(title)}[ \t]*$", docs, re.M):
            problems.append(f"docs lack the section '## {title}'")
        elif not rule.doc_section(title):
            problems.append(f"docs section '## {title}' is empty")
        elif title in CODE_SECTIONS and not PYTHON_BLOCK.search(rule.doc_section(title)):
            problems.append(f"docs section '## {title}' has no ```python code block")
    return problems


def identity_problems(rules) -> list[str]:
    """Codes and slugs unique across the rules."""
    problems = []
    for attr in ("code", "slug"):
        seen: dict[str, str] = {}
        for rule in rules:
            value = getattr(rule, attr, None)
            if value in seen:
                problems.append(f"{attr} {value!r} used by {seen[value]} and {rule.__name__}")
            seen.setdefault(value, rule.__name__)
    return problems


def rule_modules(package=rules_pkg) -> dict[str, list[type]]:
    """Every module of the rules package -> the public Rule subclasses it defines."""
    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        found[module.__name__] = [
            obj for name, obj in vars(module).items()
            if inspect.isclass(obj) and issubclass(obj, Rule) and obj is not Rule
            and obj.__module__ == module.__name__ and not name.startswith("_")
        ]
    return found


def module_problems(rule, modules: dict[str, list[type]]) -> list[str]:
    """One rule per file, the file named after the slug (``-`` -> ``_``)."""
    expected = f"{rules_pkg.__name__}.{rule.slug.replace('-', '_')}"
    if rule.__module__ != expected:
        return [f"defined in {rule.__module__}, expected in {expected} "
                f"(graddoctor/rules/{rule.slug.replace('-', '_')}.py)"]
    others = [c.__name__ for c in modules.get(expected, []) if c is not rule]
    return [f"{expected} also defines {', '.join(others)}: one rule per file"] if others else []


def fixture_index(root: str = FIXTURES) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``(bad, good)``: fixture path (relative to root) -> the slugs it marks / declares silent."""
    bad, good = {}, {}
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        name, rel = os.path.basename(path), os.path.relpath(path, root)
        if name.startswith("bad_"):
            expectations, _ = read_marks(path)
            bad[rel] = {slug for e in expectations for slug, _severity in e.alternatives}
        elif name.startswith("good_"):
            good[rel] = read_silent(path)
    return bad, good


def coverage_problems(rule, bad: dict[str, set[str]], good: dict[str, set[str]]) -> list[str]:
    """A rule needs a bad fixture marking it and a good fixture declaring it silent."""
    problems = []
    if not any(rule.slug in slugs for slugs in bad.values()):
        problems.append(f"no fixtures/**/bad_*.py with a '# expect: {rule.slug}' mark")
    if not any(rule.slug in slugs for slugs in good.values()):
        problems.append(f"no fixtures/**/good_*.py with a '# silent: {rule.slug}' declaration")
    return problems


BAD, GOOD = fixture_index()
MODULES = rule_modules()
DEFINED = [(module, cls) for module, classes in sorted(MODULES.items()) for cls in classes]
SLUGS = {r.slug for r in ALL_RULES}


def read_readme() -> str:
    with open(os.path.join(ROOT, "docs", "rules.md"), encoding="utf-8") as f:
        return f.read()


def read_architecture() -> str:
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        return f.read()


# --- the contract, per rule ----------------------------------------------------------------

@pytest.mark.parametrize("rule", ALL_RULES, **RULE_IDS)
def test_rule_docs_and_identity(rule):
    problems = doc_problems(rule)
    assert not problems, f"{rule.slug}: " + "; ".join(problems)


def test_codes_and_slugs_are_unique():
    problems = identity_problems(ALL_RULES)
    assert not problems, "; ".join(problems)


@pytest.mark.parametrize("rule", ALL_RULES, **RULE_IDS)
def test_rule_has_its_own_file(rule):
    problems = module_problems(rule, MODULES)
    assert not problems, f"{rule.slug}: " + "; ".join(problems)


@pytest.mark.parametrize("module,cls", DEFINED, ids=[f"{m.rsplit('.', 1)[-1]}.{c.__name__}" for m, c in DEFINED])
def test_every_rule_class_is_registered(module, cls):
    assert cls in ALL_RULES, f"{module}.{cls.__name__} is not in graddoctor.rules.ALL_RULES"


def unit_test_problems(rule, tests_dir: str = os.path.join(ROOT, "tests")) -> list[str]:
    """A rule's unit tests sit in one file named after it, where a reader looks for them."""
    name = f"test_rule_{rule.slug.replace('-', '_')}.py"
    return [] if os.path.isfile(os.path.join(tests_dir, name)) else [f"no tests/{name}"]


@pytest.mark.parametrize("rule", ALL_RULES, **RULE_IDS)
def test_rule_has_its_test_file(rule):
    problems = unit_test_problems(rule)
    assert not problems, f"{rule.slug}: " + "; ".join(problems)


@pytest.mark.parametrize("rule", ALL_RULES, **RULE_IDS)
def test_rule_has_bad_and_good_fixtures(rule):
    problems = coverage_problems(rule, BAD, GOOD)
    assert not problems, f"{rule.slug}: " + "; ".join(problems)


@pytest.mark.parametrize("fixture", sorted(GOOD), ids=str)
def test_good_fixture_declares_known_rules(fixture):
    declared = GOOD[fixture]
    assert declared, f"{fixture}: no '# silent: <slug>, ...' line at its end"
    unknown = sorted(declared - SLUGS)
    assert not unknown, f"{fixture}: '# silent:' names unknown rules {unknown}"


@pytest.mark.parametrize("fixture", sorted(BAD), ids=str)
def test_bad_fixture_marks_known_rules(fixture):
    unknown = sorted(BAD[fixture] - SLUGS)
    assert not unknown, f"{fixture}: '# expect:' names unknown rules {unknown}"


def test_readme_rules_table_is_generated():
    expected, actual = rules_table(), readme_table(read_readme())
    assert actual == expected, (
        "docs/rules.md's rules table differs from the rules; run: python -m graddoctor.rules.docs --write\n"
        + "\n".join(f"docs:  {a}\nrules: {e}" for a, e in zip(actual.splitlines(), expected.splitlines())
                    if a != e))


@pytest.mark.parametrize("rule", ALL_RULES, **RULE_IDS)
def test_readme_table_row(rule):
    rows = [line for line in readme_table(read_readme()).splitlines() if line.startswith(f"| {rule.code} |")]
    assert rows == [line for line in rules_table().splitlines() if line.startswith(f"| {rule.code} |")], \
        f"{rule.slug}: docs/rules.md's row is missing or stale; run: python -m graddoctor.rules.docs --write"


# --- the checkers can fail ---------------------------------------------------------------

class _Fake(Rule):
    """
    ## What it does
    Finds nothing.

    ## Why is this bad?

    ## Example
    no code here

    ## Use instead
    ```python
    pass
    ```
    """

    code = "GD1"
    slug = "Fake_Rule"
    severity = Severity.WARNING
    summary = "finds nothing"
    fix = ""


def test_checkers_report_violations():
    problems = doc_problems(_Fake)
    assert "docs section '## Why is this bad?' is empty" in problems
    assert "docs section '## Example' has no ```python code block" in problems
    assert not any("Use instead" in p for p in problems)
    assert "no fix" in problems
    assert any("'GD1'" in p for p in problems) and any("'Fake_Rule'" in p for p in problems)

    class NoDocs(Rule):
        code, slug, severity, summary, fix = "GD999", "no-docs", Severity.INFO, "x", "y"

    assert sum("lack the section" in p for p in doc_problems(NoDocs)) == len(SECTIONS)

    twin = type("Twin", (Rule,), {"code": ALL_RULES[0].code, "slug": ALL_RULES[1].slug})
    assert len(identity_problems([*ALL_RULES, twin])) == 2

    misplaced = type("Misplaced", (Rule,), {"slug": ALL_RULES[0].slug, "__module__": "graddoctor.rules.elsewhere"})
    assert module_problems(misplaced, MODULES)
    crowded = {ALL_RULES[0].__module__: [ALL_RULES[0], twin]}
    assert module_problems(ALL_RULES[0], crowded) == [f"{ALL_RULES[0].__module__} also defines Twin: one rule per file"]

    no_fixtures = type("Lonely", (Rule,), {"slug": "lonely-rule"})
    assert unit_test_problems(no_fixtures) == ["no tests/test_rule_lonely_rule.py"]
    assert len(coverage_problems(no_fixtures, BAD, GOOD)) == 2
    assert coverage_problems(no_fixtures, {"bad_x.py": {"lonely-rule"}}, {"good_x.py": {"lonely-rule"}}) == []


def test_stale_readme_table_is_detected():
    readme = read_readme()
    first = ALL_RULES[0]
    stale = readme.replace(f"| {first.code} | `{first.slug}` | {first.severity.value} |",
                           f"| {first.code} | `{first.slug}` | info |", 1)
    assert stale != readme and readme_table(stale) != rules_table()
    assert with_table(stale) == with_table(readme)  # the generator repairs it
    start, end = table_span(readme)
    assert readme[start:end].startswith("| code | slug |") and readme[end:end + 1] == "\n"


@pytest.mark.parametrize("rule", ALL_RULES, **RULE_IDS)
def test_rule_says_what_it_stays_silent_on(rule):
    text = rule.doc_section("Stays silent on")
    assert len(text.split()) >= 5, f"{rule.slug}: its docstring has no '## Stays silent on' section"
    assert "```" not in text, f"{rule.slug}: 'Stays silent on' is prose (it becomes a table cell)"


def test_architecture_silent_table_is_generated():
    expected, actual = silent_table(), architecture_table(read_architecture())
    assert actual == expected, (
        "docs/architecture.md's table of correct look-alikes differs from the rules' 'Stays silent "
        "on' sections; run: python -m graddoctor.rules.docs --write")


def test_stale_architecture_table_is_detected_and_repaired():
    text = read_architecture()
    first = ALL_RULES[0]
    row = f"| `{first.slug}` | "
    assert row in text
    stale = text.replace(row, row + "something it no longer says; ", 1)
    assert architecture_table(stale) != silent_table()
    assert with_silent_table(stale) == with_silent_table(text) == text
