"""The fixture harness itself (tests/fixture_marks.py): how marks are read, and that
``compare`` fails on every kind of disagreement a fixture can have with its check."""

from __future__ import annotations

import pytest

from fixture_marks import Expectation, Seen, compare, parse_mark, read_marks, read_silent
from graddoctor.rules import ALL_RULES, find_rule

NAME = "bad_x.py"


def default(slug: str) -> str:
    return find_rule(slug).severity.value


def mark(line: int, text: str) -> list[Expectation]:
    return parse_mark(line, text)


def seen(line, slug, severity=None, path=NAME) -> Seen:
    return Seen(path, line, slug, severity or default(slug))


# -- reading marks ---------------------------------------------------------------------------
def test_a_plain_slug_means_the_rules_default_severity():
    for rule in ALL_RULES:
        [exp] = mark(3, rule.slug)
        assert exp == Expectation(3, frozenset({(rule.slug, rule.severity.value)}))


def test_severity_alternatives_and_several_findings():
    [exp] = mark(5, "accumulation-leftover(info)")
    assert exp.alternatives == {("accumulation-leftover", "info")}
    [exp] = mark(5, "stale-grad|missing-zero-grad(warning)")
    assert exp.alternatives == {("stale-grad", default("stale-grad")), ("missing-zero-grad", "warning")}
    first, second = mark(7, "stale-grad, missing-zero-grad ( info )")
    assert (first.line, second.line) == (7, 7)
    assert first.alternatives == {("stale-grad", default("stale-grad"))}
    assert second.alternatives == {("missing-zero-grad", "info")}


@pytest.mark.parametrize("text", ["no-such-rule", "GD101", "missing-zero-grad(fatal)",
                                  "missing-zero-grad(info", "stale-grad (info) x"])
def test_a_mark_that_names_no_rule_or_severity_is_refused(text):
    with pytest.raises(ValueError):
        mark(1, text)


def test_read_marks_from_a_file(tmp_path):
    path = tmp_path / NAME
    path.write_text("import torch\n"
                    "# graddoctor-args: --steps 4\n"
                    "opt.step()  # expect: stale-grad(info), missing-zero-grad\n"
                    "x = 1  # expect: misplaced-zero-grad|partial-zero-grad\n")
    expectations, args = read_marks(str(path))
    assert args == ["--steps", "4"]
    assert expectations == [
        Expectation(3, frozenset({("stale-grad", "info")})),
        Expectation(3, frozenset({("missing-zero-grad", default("missing-zero-grad"))})),
        Expectation(4, frozenset({("misplaced-zero-grad", default("misplaced-zero-grad")),
                                  ("partial-zero-grad", default("partial-zero-grad"))})),
    ]


# -- compare: agreement ----------------------------------------------------------------------
def test_agreeing_findings_pass():
    marks = mark(10, "missing-zero-grad") + mark(12, "stale-grad|partial-zero-grad, accumulation-leftover(info)")
    found = [seen(10, "missing-zero-grad"), seen(12, "partial-zero-grad"),
             seen(12, "accumulation-leftover", "info"),
             seen(30, "clip-in-accumulation", "info"),  # unmarked info: allowed
             Seen(None, None, "param-without-grad", "info"), Seen("other.py", 3, "stale-grad", "info")]
    assert compare(marks, found, NAME) == []


def test_a_bad_fixture_tolerates_unmarked_info():
    assert compare(mark(3, "missing-zero-grad"),
                   [seen(3, "missing-zero-grad"), seen(4, "accumulation-leftover", "info"),
                    Seen(None, None, "stale-grad", "info")], NAME) == []


def test_a_good_fixture_passes_with_no_finding_or_only_its_marked_info():
    good = "good_x.py"
    assert compare([], [], good, silent={"stale-grad"}) == []
    info = seen(4, "accumulation-leftover", "info", path=good)
    assert compare(mark(4, "accumulation-leftover(info)"), [info], good, silent={"stale-grad"}) == []


def test_read_silent(tmp_path):
    script = tmp_path / "good_x.py"
    script.write_text("x = 1  # silent: not-a-declaration\n# silent: a-b, c-d\n#silent:e-f\n")
    assert read_silent(str(script)) == {"a-b", "c-d", "e-f"}


# -- compare: every strictness case fails ----------------------------------------------------
def test_a_mark_without_a_finding_fails():
    [problem] = compare(mark(10, "missing-zero-grad"), [], NAME)
    assert "line 10" in problem and "missing-zero-grad" in problem and "not reported" in problem


def test_a_finding_on_another_line_fails():
    problems = compare(mark(10, "missing-zero-grad"), [seen(11, "missing-zero-grad")], NAME)
    assert len(problems) == 2  # the mark is not met, and the finding is not expected
    assert "line 10" in problems[0] and "unexpected" in problems[1] and f"{NAME}:11" in problems[1]


def test_another_rule_at_the_line_fails():
    problems = compare(mark(10, "missing-zero-grad"), [seen(10, "stale-grad")], NAME)
    assert len(problems) == 2 and "reported there" in problems[0] and "stale-grad" in problems[0]


def test_the_default_severity_is_expected_unless_marked():
    slug = "accumulation-leftover"
    assert default(slug) == "warning"
    problems = compare(mark(10, slug), [seen(10, slug, "info")], NAME)
    assert len(problems) == 1 and "expected accumulation-leftover(warning)" in problems[0]


def test_a_marked_severity_is_held_to():
    slug = "accumulation-leftover"
    problems = compare(mark(10, f"{slug}(info)"), [seen(10, slug, "warning")], NAME)
    assert len(problems) == 2
    assert "expected accumulation-leftover(info)" in problems[0]
    assert problems[1] == f"unexpected warning {slug} at {NAME}:10"


def test_an_error_where_a_warning_is_expected_fails():
    problems = compare(mark(10, "stale-grad(warning)"), [seen(10, "stale-grad", "error")], NAME)
    assert len(problems) == 2


def test_a_finding_in_another_file_does_not_meet_a_mark_and_is_unexpected():
    problems = compare(mark(10, "missing-zero-grad"),
                       [seen(10, "missing-zero-grad", path="helper.py")], NAME)
    assert len(problems) == 2 and problems[1].endswith("at helper.py:10")


@pytest.mark.parametrize("severity", ["warning", "error"])
def test_a_bad_fixture_fails_on_an_unexpected_finding_anywhere(severity):
    marks = mark(10, "missing-zero-grad")
    met = seen(10, "missing-zero-grad")
    for stray in (seen(20, "stale-grad", severity), seen(20, "stale-grad", severity, path="lib.py"),
                  Seen(None, None, "stale-grad", severity)):
        assert compare(marks, [met, stray], NAME) == [f"unexpected {stray}"]


@pytest.mark.parametrize("severity", ["warning", "error"])
def test_a_good_fixture_fails_on_any_warning_or_error(severity):
    for stray in (seen(5, "stale-grad", severity, path="good_x.py"),
                  seen(5, "stale-grad", severity, path="lib.py"),
                  Seen(None, None, "stale-grad", severity)):
        assert compare([], [stray], "good_x.py", silent={"missing-zero-grad"}) == [f"unexpected {stray}"]
    assert "(no location)" in str(Seen(None, None, "stale-grad", severity))


@pytest.mark.parametrize("where", [("good_x.py", 5), ("lib.py", 5), (None, None)])
def test_a_good_fixture_fails_on_an_unmarked_info_anywhere(where):
    stray = Seen(*where, "accumulation-leftover", "info")
    assert compare([], [stray], "good_x.py", silent={"stale-grad"}) == [f"unexpected {stray}"]


@pytest.mark.parametrize("severity", ["info", "warning", "error"])
def test_a_good_fixture_fails_on_any_finding_of_a_rule_it_declares_silent(severity):
    good = "good_x.py"
    fired = seen(5, "stale-grad", severity, path=good)
    assert compare([], [fired], good, silent={"stale-grad"}) == [f"declared silent, yet reported: {fired}"]
    # a mark cannot excuse it: declaring a rule silent and expecting it contradict each other
    problems = compare(mark(5, "stale-grad(info)"), [seen(5, "stale-grad", "info", path=good)],
                       good, silent={"stale-grad"})
    assert problems == ["line 5: expects stale-grad, which the fixture declares silent",
                        f"declared silent, yet reported: {seen(5, 'stale-grad', 'info', path=good)}"]


def test_an_unknown_severity_fails():
    assert compare([], [seen(5, "stale-grad", "fatal")], NAME) == [
        f"unknown severity: fatal stale-grad at {NAME}:5"]
