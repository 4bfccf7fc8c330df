"""analysis/source.py's inside_loop and rules/base.py's helper_call: a zero_grad() inside a
helper names the helper's call in the loop; one inside the loop's own function (a main()) does
not name main()'s call."""

from __future__ import annotations

import textwrap

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.analysis.source import inside_loop
from graddoctor.rules.base import helper_call
from graddoctor.trace import Location, TraceBuilder

SOURCE = textwrap.dedent("""\
    def reset(opt):
        opt.zero_grad()

    def main(opt, loader):
        for x in loader:
            opt.zero_grad()
            reset(opt)

            def inner():
                return 1

    main(None, [])
""")


def test_inside_loop_reads_the_scope_of_the_line(tmp_path):
    path = tmp_path / "script.py"
    path.write_text(SOURCE)
    assert inside_loop(str(path), 2) is False  # in reset: no loop of its own
    assert inside_loop(str(path), 6) is True and inside_loop(str(path), 7) is True
    assert inside_loop(str(path), 10) is False  # a nested function: main's loop does not count
    assert inside_loop(str(path), 12) is False
    assert inside_loop(str(tmp_path / "missing.py"), 3) is None


def clear_at(path, line, function, caller):
    t = TraceBuilder()
    t.trace.put(ev.clear(via="optimizer.zero_grad", opt=0, params=[0], caller=[caller.path, caller.line, caller.function]),
                Location(path, line, function))
    return Analysis(t.trace), t.trace.events[-1]


def test_helper_call_names_the_call_in_the_loop_only(tmp_path):
    path = str(tmp_path / "script.py")
    (tmp_path / "script.py").write_text(SOURCE)
    related = helper_call(*clear_at(path, 2, "reset", Location(path, 7, "main")))
    assert related is not None and related.location.line == 7 and "reset()" in related.note
    # the zero_grad in main's own loop: main's call at module level is no place to look
    assert helper_call(*clear_at(path, 6, "main", Location(path, 12, "<module>"))) is None
    # a helper called outside any loop
    assert helper_call(*clear_at(path, 2, "reset", Location(path, 12, "<module>"))) is None
