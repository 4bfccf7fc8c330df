"""group-baseline-misaligned (GD166): the per-group statistics analysis/group_broadcast.py reads
as expanded in the other layout than the view they were reduced from."""

from __future__ import annotations

from textwrap import dedent

import pytest

from graddoctor.analysis.group_broadcast import misaligned_group_expansions


def _read(tmp_path, text):
    path = tmp_path / "grpo.py"
    path.write_text(dedent(text))
    return [(line, axis, expansion) for line, _flat, _at, axis, expansion in misaligned_group_expansions(str(path))]


@pytest.mark.parametrize("body, found", [
    ("m = r.view(-1, G).mean(dim=1).repeat(G)\nadv = r - m\n", [(1, "rows", "repeat")]),
    ("m = r.view(-1, G).mean(dim=0).repeat_interleave(G)\nadv = (r - m) / s\n", [(1, "columns", "repeat_interleave")]),
    ("g = r.view(-1, G)\nm = g.mean(1)\ns = g.std(1)\nm = m.repeat(G)\ns = s.repeat_interleave(G)\nadv = (r - m) / (s + 1e-4)\n",
     [(4, "rows", "repeat")]),
    ("s = r.reshape(N, G).std(dim=-1).repeat(G)\nadv = (r - mu) / (s + 1e-8)\n", [(1, "rows", "repeat")]),
    ("b = r.view(N, G).max(dim=0).values.repeat_interleave(G)\nw = r - b\n", [(1, "columns", "repeat_interleave")]),
    ("def f(r):\n    return r - r.view(-1, G).mean(1).repeat(G)\n", [(2, "rows", "repeat")]),
])
def test_a_statistic_expanded_in_the_other_layout_is_read(tmp_path, body, found):
    assert _read(tmp_path, body) == found


@pytest.mark.parametrize("body", [
    "m = r.view(-1, G).mean(dim=1).repeat_interleave(G)\nadv = r - m\n",
    "m = r.view(G, -1).mean(dim=0).repeat(G)\nadv = r - m\n",
    "g = r.view(-1, G)\nadv = (g - g.mean(dim=1, keepdim=True)).reshape(-1)\n",
    "m = r.view(-1, G).mean(dim=1).repeat(G)\nlog(m)\n",  # never meets the flat tensor
    "m = r.view(-1, G).mean(dim=1).repeat(G, 1)\nadv = r - m\n",  # a 2-D repeat: not a vector's expansion
    "m = r.view(2, 3, 4).mean(dim=1).repeat(G)\nadv = r - m\n",  # more than two axes
    "m = q.view(-1, G).mean(dim=1).repeat(G)\nadv = r - m\n",  # another tensor's statistic
])
def test_aligned_expansions_and_other_shapes_read_as_nothing(tmp_path, body):
    assert _read(tmp_path, body) == []
