"""meshgrid-axes-swapped (GD348): coordinate grids unpacked into names of the other image axis
(source only; the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.meshgrid_axes_swapped import axis_of_name, swapped_meshgrids

USE = "\nd = (xs - cx) ** 2 + (ys - cy) ** 2\n"


def found(code: str) -> list[tuple[int, str, str]]:
    return [(line, name, first) for line, _, name, first, _ in swapped_meshgrids(ast.parse(code))]


def test_axis_names():
    assert [axis_of_name(n) for n in ("xs", "grid_y", "feat_w", "rows", "center_x", "ii", "xy")] == \
        ["x", "y", "x", "y", "x", None, None]


def test_ij_grid_named_x_first_is_swapped():
    assert found('xs, ys = torch.meshgrid(r, r, indexing="ij")' + USE) == [(1, "xs", "y")]
    assert found("xs, ys = torch.meshgrid(r, r)" + USE) == [(1, "xs", "y")]  # torch's default
    assert found("xs, ys = torch.meshgrid([r, r])" + USE) == [(1, "xs", "y")]


def test_xy_grid_named_y_first_is_swapped():
    assert found('ys, xs = torch.meshgrid(r, r, indexing="xy")' + USE) == [(1, "ys", "x")]
    assert found("ys, xs = np.meshgrid(r, r)" + USE) == [(1, "ys", "x")]  # numpy's default


def test_outputs_named_against_their_ranges():
    code = "xs, ys = torch.meshgrid(torch.arange(h), torch.arange(w))" + USE
    assert found(code) == [(1, "xs", "y")]


def test_correct_grids_are_silent():
    assert found('ys, xs = torch.meshgrid(r, r, indexing="ij")' + USE) == []
    assert found('xs, ys = torch.meshgrid(r, r, indexing="xy")' + USE) == []
    assert found("xx, yy = np.meshgrid(r, r)\nd = (xx - cx) ** 2 + (yy - cy) ** 2\n") == []
    # a W x H layout named for its ranges
    assert found("xs, ys = torch.meshgrid(torch.arange(w), torch.arange(h), indexing='ij')" + USE) == []


def test_unknown_or_symmetric_uses_are_silent():
    assert found('xs, ys = torch.meshgrid(r, r, indexing="ij")\nd = xs ** 2 + ys ** 2\n') == []
    assert found('ii, jj = torch.meshgrid(r, r, indexing="ij")\nd = (ii - cx) ** 2\n') == []
    assert found('xs, ys = torch.meshgrid(a, b, indexing="ij")' + USE) == []  # ranges say no axis
    assert found('xs, ys = torch.meshgrid(r, r, indexing=mode)' + USE) == []
