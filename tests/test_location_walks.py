"""``LocationFinder.here`` remembers its walks up the stack per place it is asked from: a stack
found the same gives the remembered location, any other stack is walked again. The answers are
those of a finder that never remembered anything, whatever the order of the call sites."""

from __future__ import annotations

import pytest
from module_files import load

from graddoctor.location import LocationFinder


@pytest.fixture
def stack(tmp_path):
    site = tmp_path / "lib" / "site-packages"
    library = load(site / "faketorch" / "hooks.py", """
        def ask(finder):  # the instrumentation asking where the user's call is
            return finder.here(1)

        def inner(finder):  # one more library frame on the way
            return ask(finder)
    """)
    framework = load(site / "lightning" / "pytorch" / "strategies" / "strategy.py", """
        def through(call, finder):
            return call(finder)
    """)
    user = load(tmp_path / "train.py", """
        def a(finder):
            return ask(finder)  # line 3

        def b(finder):
            return ask(finder)  # line 6

        def c(finder):
            return inner(finder)  # line 9

        def d(finder):
            x = ask(finder); y = ask(finder)  # line 12, two instructions
            return x, y

        def e(finder):
            return ask(finder)  # line 16

        def f(finder):
            return through(ask, finder)  # line 19
    """, ask=library.ask, inner=library.inner, through=framework.through)
    return library, framework, user, tmp_path


def _fresh(tmp_path):
    return LocationFinder(relative_to=str(tmp_path))


def test_each_call_site_gets_its_own_line_in_any_order(stack):
    library, framework, user, tmp_path = stack
    finder = _fresh(tmp_path)
    calls = [user.a, user.b, user.c, user.e, user.a, user.e, user.b, user.c, user.a, user.a,
             user.e, user.b, user.b, user.c]
    for call in calls:  # more call sites than walks remembered per place
        assert finder.here.__self__ is finder
        got = call(finder)
        assert got == call(_fresh(tmp_path))
        assert got.path == "train.py"
    assert [call(finder).line for call in (user.a, user.b, user.c, user.e)] == [3, 6, 9, 16]
    x, y = user.d(finder)
    assert (x.line, y.line) == (12, 12) and (x, y) == user.d(_fresh(tmp_path))


def test_a_walk_through_a_framework_is_not_taken_for_a_plain_one(stack):
    library, framework, user, tmp_path = stack
    finder = _fresh(tmp_path)
    plain = user.a(finder)
    via = user.f(finder)
    assert not plain.via and via.via and via == user.f(_fresh(tmp_path))
    assert user.a(finder) == plain and user.f(finder) == via and user.a(finder) == plain


def test_a_remembered_walk_is_read_back(stack):
    # the second call from the same place and stack returns the remembered location (the
    # test of the remembering itself: without it nothing is kept)
    library, framework, user, tmp_path = stack
    finder = _fresh(tmp_path)
    first = user.a(finder)
    assert finder._walked and any(walk[1] is first for walks in finder._walked.values()
                                  for walk in walks)
    assert user.a(finder) is first


def test_asked_from_the_users_own_frame_and_from_the_stacks_bottom(stack, tmp_path):
    # here(1) from a user frame is that frame; a remembered walk longer than the stack it is
    # tried on is a mismatch, not an error
    library, framework, user, _ = stack
    mine = load(tmp_path / "direct.py", """
        def direct(finder):
            return finder.here(1)  # line 3
    """)
    finder = _fresh(tmp_path)
    assert mine.direct(finder).line == 3 and mine.direct(finder).line == 3
    assert user.c(finder).line == 9 and user.a(finder).line == 3 and user.c(finder).line == 9
