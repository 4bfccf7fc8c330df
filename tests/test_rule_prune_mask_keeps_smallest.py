"""prune-mask-keeps-smallest (GD413): the magnitude-pruning masks analysis/prune_masks.py reads
as keeping the smallest weights (or zeroing the largest), and the rule over a trace's backwards."""

from __future__ import annotations

from textwrap import dedent

import pytest

from graddoctor.analysis.prune_masks import inverted_prune_masks

_HEAD = """\
thresh = p.detach().abs().flatten().kthvalue(k).values
"""


def _read(tmp_path, text, head=_HEAD):
    path = tmp_path / "prune.py"
    path.write_text(head + dedent(text))
    return [(line, kept, use) for line, _, kept, use in inverted_prune_masks(str(path))]


@pytest.mark.parametrize("text, found", [
    ("masks[name] = (p.detach().abs() < thresh).float()\np.mul_(masks[name])\n",
     [(2, "p.detach().abs() > thresh", 3)]),
    ("mask = p.abs().le(thresh)\nw.data *= mask\n", [(2, "p.abs().ge(thresh)", 3)]),
    ("mask = torch.lt(torch.abs(w), thresh).float()\nw.data = w.data * mask\n",
     [(2, "torch.abs(w).gt(thresh)", 3)]),
    ("mask = (thresh > w.abs()).float()\nout = F.linear(x, w * mask)\n", [(2, "thresh < w.abs()", 3)]),
    ("w[w.abs() > thresh] = 0\n", [(2, "w.abs() < thresh", 2)]),
    ("keep = [torch.le(w.abs(), thresh).float() for w in ws]\nfor w, k in zip(ws, keep):\n    w *= k\n",
     [(2, "w.abs().ge(thresh)", 4)]),
    ("keep = {n: (w.abs() < thresh) for n, w in named}\nfor n, w in named:\n    w.mul_(keep[n])\n",
     [(2, "w.abs() > thresh", 4)]),
    ("w.masked_fill_(w.abs() >= thresh, 0)\n", [(2, "w.abs() <= thresh", 2)]),
])
def test_a_mask_keeping_the_smallest_weights_is_read(tmp_path, text, found):
    assert _read(tmp_path, text) == found


def test_a_threshold_taken_from_a_sorted_magnitude_is_followed_one_step(tmp_path):
    head = "ordered = torch.sort(w.abs().flatten()).values\ncut = ordered[n]\n"
    assert _read(tmp_path, "keep = (w.abs() <= cut).float()\nw.mul_(keep)\n", head) == \
        [(3, "w.abs() >= cut", 4)]


def test_a_threshold_over_magnitudes_gathered_first_is_read(tmp_path):
    head = "mags = torch.cat([w.abs().flatten() for w in ws])\ncutoff = torch.quantile(mags, 0.6)\n"
    assert _read(tmp_path, "m = (w.abs() < cutoff).float()\nw.mul_(m)\n", head) == \
        [(3, "w.abs() > cutoff", 4)]


@pytest.mark.parametrize("text", [
    "masks[name] = (p.detach().abs() > thresh).float()\np.mul_(masks[name])\n",
    "w[w.abs() < thresh] = 0\n",  # the small ones zeroed: right
    "w.masked_fill_(w.abs() <= thresh, 0)\n",
    "mask = (w.abs() < thresh).float()\nw.mul_(1 - mask)\n",  # complemented
    "small = (w.abs() < thresh).float()\nlarge = (w.abs() >= thresh).float()\nq = w * small + w * large\n",
    "mask = (w.abs() < thresh).float()\nprint(mask.mean())\n",  # never applied
    "mask = (w.abs() < 0.01).float()\nw.mul_(mask)\n",  # no pruning threshold named
])
def test_right_masks_splits_and_other_comparisons_read_as_nothing(tmp_path, text):
    assert _read(tmp_path, text) == []


def test_a_fixed_clip_value_is_no_pruning_threshold(tmp_path):
    head = "limit = 3.0\n"
    assert _read(tmp_path, "mask = (w.abs() < limit).float()\nw.mul_(mask)\n", head) == []


def test_the_rule_looks_only_at_files_whose_backwards_ran(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "prune.py"
    script.write_text(_HEAD + "mask = (p.abs() < thresh).float()\np.data.mul_(mask)\n")
    rule = find_rule("prune-mask-keeps-smallest")()
    b = TraceBuilder(path=str(script))
    b.optimizer(0, [0], line=1)
    assert list(rule.check(Analysis(b.trace))) == []
    b.backward(fresh=[0], line=3)
    found = list(rule.check(Analysis(b.trace)))
    assert [(f.location.line, f.evidence["use_line"]) for f in found] == [(2, 3)]
    assert "p.abs() > thresh" in found[0].fix and found[0].code == "GD413"
