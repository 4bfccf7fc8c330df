"""slice-overwritten (GD393): a tensor slice assigned twice in a row with nothing reading it in
between (source only; the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.slice_overwritten import overwritten_slices


def _found(src):
    return [(line, target, first) for line, target, first in overwritten_slices(ast.parse(src))]


def test_a_copied_line_whose_target_was_not_edited():
    src = ("def f(x_ft, w1, w2, m):\n    out = torch.zeros_like(x_ft)\n"
           "    out[:, :m] = x_ft[:, :m] * w1\n    out[:, :m] = x_ft[:, -m:] * w2\n    return out\n")
    assert _found(src) == [(4, "out[:, :m]", 3)]


def test_distinct_slots_updates_and_reads_between_are_silent():
    assert _found("out[:, :m] = a\nout[:, -m:] = b\n") == []
    assert _found("out[0] = a\nout[0] = out[0] * 2\n") == []
    assert _found("out[0] = a\nsave = out.clone()\nout[0] = b\n") == []
    assert _found("out[0] = a\nlog(step)\nout[0] = b\n") == []  # a call may read it through a view


def test_branches_and_moving_indices_are_silent():
    assert _found("if p:\n    y[-1] = y[0]\nelse:\n    y[-1] = 0.0\n") == []
    assert _found("for j in r:\n    y[i] = a\n    i = i + 1\n    y[i] = b\n") == []


def test_an_index_moved_between_the_writes_is_another_slice_but_one_moved_after_is_not():
    from graddoctor.rules.slice_overwritten import overwritten_slices
    moved = ast.parse("out[k] = a\nk += 1\nout[k] = b\n")
    assert overwritten_slices(moved) == []
    after = ast.parse("m1, m2 = self.m1, self.m2\nout[:, :m1, :m2] = a\nout[:, :m1, :m2] = b\nk += 1\n")
    assert overwritten_slices(after) == [(3, "out[:, :m1, :m2]", 2)]
