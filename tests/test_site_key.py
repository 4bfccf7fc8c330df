"""``location.site_key``: the (code, line) keys of the sets and dicts a watcher consults on
every call are the code object's id, never the code object (whose hash is computed from its
whole content on each lookup, and which equals another of the same text from another file)."""

import sys

from graddoctor.location import site_key

SOURCE = "import sys\ndef where():\n    return sys._getframe(0)\n"


def _frame_of(filename: str):
    scope: dict = {}
    exec(compile(SOURCE, filename, "exec"), scope)
    return scope["where"]()


def test_the_same_text_in_two_files_gives_two_keys():
    a, b = _frame_of("a.py"), _frame_of("b.py")
    assert a.f_code == b.f_code and a.f_code is not b.f_code  # equal code objects, two files
    held: dict = {}
    assert site_key(a, held) != site_key(b, held)
    assert site_key(a, held) == site_key(a, held) == (id(a.f_code), a.f_lineno)


def test_the_code_object_of_a_key_is_held_while_it_is_a_key():
    held: dict = {}
    key = site_key(_frame_of("c.py"), held)  # the frame and its function are gone now
    assert held[key[0]].co_filename == "c.py"
    assert sys.getrefcount(held[key[0]]) >= 2


def test_a_watcher_key_does_not_hash_the_code_object():
    class Unhashable:  # stands in for a code object whose hash would be costly
        f_lineno = 7

        def __init__(self):
            self.f_code = self

        def __hash__(self):
            raise AssertionError("hashed")

    frame = Unhashable()
    key = site_key(frame, {})
    assert hash(key) == hash((id(frame), 7))
