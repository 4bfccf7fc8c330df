"""``LocationFinder.here_and_caller`` (one walk up the stack for a zero_grad's clear event) gives
what ``here`` and ``caller_of`` give, on every shape of call stack."""

from __future__ import annotations

import pytest
from module_files import load

from graddoctor.location import LocationFinder


@pytest.fixture
def stack(tmp_path):
    site = tmp_path / "lib" / "site-packages"
    library = load(site / "faketorch" / "optim.py", """
        def zero_grad(finder):  # the instrumentation's view of this call: both ways
            return finder.here_and_caller(1), (finder.here(1), finder.caller_of(1))

        def run(fn, finder):  # a library calling the user's function
            return fn(finder)
    """)
    framework = load(site / "lightning" / "pytorch" / "strategies" / "strategy.py", """
        def optimizer_zero_grad(call, finder):
            return call(finder)
    """)
    finder = LocationFinder(relative_to=str(tmp_path))
    user = load(tmp_path / "train.py", """
        def reset(finder):
            return zero_grad(finder)

        def loop(finder):
            return reset(finder)  # line 6: the helper's call in the loop

        def hook(finder):
            return zero_grad(finder)

        AT_MODULE_LEVEL = zero_grad(FINDER)
    """, zero_grad=library.zero_grad, FINDER=finder)
    return library, framework, user, finder


def test_a_helpers_zero_grad_names_its_call_in_the_loop(stack):
    _, _, user, finder = stack
    one_walk, two_walks = user.loop(finder)
    assert one_walk == two_walks
    here, caller = one_walk
    assert (here.path, here.line, caller.path, caller.line) == ("train.py", 3, "train.py", 6)


def test_at_module_level_there_is_no_caller(stack):
    _, _, user, _ = stack
    one_walk, two_walks = user.AT_MODULE_LEVEL
    assert one_walk == two_walks and one_walk[1] is None and one_walk[0].line == 11


def test_a_user_function_a_library_called_has_no_caller(stack):
    library, _, user, finder = stack
    one_walk, two_walks = library.run(user.hook, finder)
    assert one_walk == two_walks and one_walk[1] is None and one_walk[0].line == 9


def test_through_a_framework_the_location_says_so(stack):
    library, framework, _, finder = stack
    one_walk, two_walks = framework.optimizer_zero_grad(library.zero_grad, finder)
    assert one_walk == two_walks and one_walk[0].via == "lightning"


def test_a_call_from_this_file_and_no_user_frame(stack):
    library, _, _, finder = stack
    one_walk, two_walks = library.zero_grad(finder)
    assert one_walk == two_walks
    finder._kinds[__file__] = False  # nothing on the stack is the user's now
    try:
        one_walk, two_walks = library.zero_grad(finder)
    finally:
        del finder._kinds[__file__]
    assert one_walk == two_walks and one_walk[1] is None


def test_the_same_code_in_two_files_keeps_each_files_path(stack, tmp_path):
    """Two code objects of the same text compare equal (and hash alike) whatever their file:
    the location caches tell them apart by identity."""
    library, _, _, finder = stack
    text = """
        def reset(finder):
            return zero_grad(finder)
    """
    first = load(tmp_path / "a" / "train.py", text, zero_grad=library.zero_grad)
    second = load(tmp_path / "b" / "train.py", text, zero_grad=library.zero_grad)
    assert first.reset.__code__ == second.reset.__code__
    for module, folder in ((first, "a"), (second, "b"), (first, "a")):
        (loc, _), (plain_loc, _) = module.reset(finder)
        assert loc.path == plain_loc.path == f"{folder}/train.py"
        assert loc.line == 3
