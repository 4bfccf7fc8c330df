"""group-index-not-offset (GD336): the per-group picks analysis/group_broadcast.py reads as
indexing a flat batch of groups without the group's offset."""

from __future__ import annotations

from textwrap import dedent

import pytest

from graddoctor.analysis.group_broadcast import group_indices_used_flat

_HEAD = "seq = sample(prompts.repeat_interleave(N, 0))\n"


def _read(tmp_path, text):
    path = tmp_path / "rft.py"
    path.write_text(dedent(text))
    return [(line, name, indexed) for line, name, indexed, _used in group_indices_used_flat(str(path))]


@pytest.mark.parametrize("body, found", [
    ("s = score(seq)\nbest = s.view(B, N).argmax(dim=1)\nkept = seq[best]\n", [(3, "best", "seq")]),
    ("g = r.view(B, N)\nhi = g.max(dim=1).indices\nx = seq[hi]\n", [(3, "hi", "seq")]),
    ("g = r.reshape(B, N)\ni = g.argmin(-1)\nlogp = f(seq)\ny = logp[i]\n", [(3, "i", "logp")]),
    ("g = r.view(B, N)\ni = g.max(1)[1]\ny = seq[i]\n", [(3, "i", "seq")]),
])
def test_a_pick_indexing_the_flat_batch_is_read(tmp_path, body, found):
    assert _read(tmp_path, _HEAD + body) == found


@pytest.mark.parametrize("body", [
    "best = r.view(B, N).argmax(1) + torch.arange(B) * N\nx = seq[best]\n",
    "best = r.view(B, N).argmax(1)\nx = seq.view(B, N, -1)[torch.arange(B), best]\n",
    "g = r.view(B, N)\nbest = g.argmax(1)\nx = g[best]\n",  # the grouped view itself
    "best = r.view(B, N).argmax(0)\nx = seq[best]\n",  # a pick over the other axis
    "table = torch.randn(N, 3)\nbest = r.view(B, N).argmax(1)\nx = table[best]\n",  # a table of the group's size
    "best = r.view(B, N).argmax(1, keepdim=True)\nx = seq[best]\n",
])
def test_offsets_grouped_views_and_tables_read_as_nothing(tmp_path, body):
    assert _read(tmp_path, _HEAD + body) == []
