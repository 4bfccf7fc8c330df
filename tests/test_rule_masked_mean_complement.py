"""masked-mean-complement (GD200): the masked means analysis/complement_mean.py reads as summing the
complement of the mask they count."""

from __future__ import annotations

from textwrap import dedent

import pytest

from graddoctor.analysis.complement_mean import complement_masked_means


def _read(tmp_path, text):
    path = tmp_path / "loss.py"
    path.write_text(dedent(text))
    return [(line, mask) for line, mask, _comp in complement_masked_means(str(path))]


@pytest.mark.parametrize("body, found", [
    ("loss = ((l * (1 - m)).sum(1) / m.sum(1)).mean()\n", [(1, "m")]),
    ("loss = (l * ~m).sum() / m.sum().clamp(min=1)\n", [(1, "m")]),
    ("loss = (l * m.logical_not()).sum(-1) / m.float().sum(-1)\n", [(1, "m")]),
    ("loss = (l * (m == 0)).sum() / torch.clamp(m.sum(), min=1.0)\n", [(1, "m")]),
    ("inv = 1.0 - m.float()\nx = l * inv\nloss = x.sum() / (m.sum() + 1e-6)\n", [(2, "m")]),
    ("def f(l, m):\n    return torch.sum(l * (1 - m), 1) / m.sum(1)\n", [(2, "m")]),
])
def test_a_complement_summed_over_the_masks_count_is_read(tmp_path, body, found):
    assert _read(tmp_path, body) == found


@pytest.mark.parametrize("body", [
    "loss = (l * m).sum() / m.sum()\n",
    "loss = (l * (1 - m)).sum() / (1 - m).sum()\n",  # a mean over the complement, on purpose
    "loss = (l * (1 - m)).sum(1) / m.sum()\n",  # different axes
    "neg = l * gt.lt(1)\nloss = neg.sum() / gt.eq(1).sum()\n",  # a complement not written as one
    "loss = (l * (1 - m)).sum() / w.sum()\n",  # another mask's count
    "inv = 1 - m\ninv = other\nx = l * inv\nloss = x.sum() / m.sum()\n",  # the name reassigned
])
def test_matching_masks_and_other_counts_read_as_nothing(tmp_path, body):
    assert _read(tmp_path, body) == []
