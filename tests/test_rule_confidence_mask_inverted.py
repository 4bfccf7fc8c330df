"""confidence-mask-inverted (GD326): the pseudo-label masks analysis/confidence_masks.py reads as
keeping the unsure rows of an unlabelled loss, and the rule over a trace's backwards."""

from __future__ import annotations

from textwrap import dedent

import pytest

from graddoctor.analysis.confidence_masks import inverted_confidence_masks

_HEAD = """\
probs = torch.softmax(logits_w.detach(), dim=-1)
max_probs, targets_u = torch.max(probs, dim=-1)
"""


def _read(tmp_path, text):
    path = tmp_path / "ssl.py"
    path.write_text(_HEAD + dedent(text))
    return [(line, conf, kept) for line, _, conf, kept, _ in inverted_confidence_masks(str(path))]


@pytest.mark.parametrize("text, found", [
    ("mask = max_probs.lt(0.95).float()\nLu = (F.cross_entropy(ls, targets_u, reduction='none') * mask).mean()\n",
     [(3, "max_probs", "max_probs.ge(0.95)")]),
    ("mask = max_probs.le(t)\nce = F.cross_entropy(ls, targets_u, reduction='none')\nLu = (mask * ce).mean()\n",
     [(3, "max_probs", "max_probs.gt(t)")]),
    ("mask = (threshold > max_probs).float()\nLu = (loss_u * mask).mean()\n",
     [(3, "max_probs", "threshold <= max_probs")]),
    ("Lu = per_sample_loss[max_probs < 0.9].mean()\n", [(3, "max_probs", "max_probs >= 0.9")]),
    ("conf = probs.max(1)[0]\nkeep = conf < 0.8\nLu = (criterion(ls, targets_u) * keep.float()).sum()\n",
     [(4, "conf", "conf >= 0.8")]),
])
def test_a_mask_keeping_the_unsure_rows_on_a_loss_is_read(tmp_path, text, found):
    assert _read(tmp_path, text) == found


@pytest.mark.parametrize("text", [
    "mask = max_probs.ge(0.95).float()\nLu = (F.cross_entropy(ls, targets_u, reduction='none') * mask).mean()\n",
    "low = max_probs.lt(0.95)\nLu = F.cross_entropy(ls, targets_u, reduction='none').masked_fill(low, 0).mean()\n",
    "low = (max_probs < 0.95).float()\nLu = (loss_u * (1 - low)).mean()\n",
    "low = max_probs < 0.95\nLu = loss_u[~low].mean()\n",
    "n_low = (max_probs < 0.95).sum()\nprint(n_low)\n",  # logged only
    "mask = max_probs.lt(0.95).float()\nacc = (mask * correct).mean()\n",  # no loss weighed
    "ent = -(probs * probs.log()).sum(-1)\nmask = (ent < 0.5).float()\nLu = (loss_u * mask).mean()\n",
    "m = scores.lt(0.5).float()\nLu = (loss_u * m).mean()\n",  # not a top probability
])
def test_confident_masks_complements_and_other_comparisons_read_as_nothing(tmp_path, text):
    assert _read(tmp_path, text) == []


def test_the_rule_looks_only_at_files_whose_backwards_ran(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "ssl.py"
    script.write_text(_HEAD + "mask = max_probs.lt(0.95).float()\nLu = (loss_u * mask).mean()\n")
    rule = find_rule("confidence-mask-inverted")()
    b = TraceBuilder(path=str(script))
    b.optimizer(0, [0], line=1)
    assert list(rule.check(Analysis(b.trace))) == []
    b.backward(fresh=[0], line=4)
    found = list(rule.check(Analysis(b.trace)))
    assert [(f.location.line, f.evidence["confidence"]) for f in found] == [(3, "max_probs")]
    assert "max_probs.ge(0.95)" in found[0].fix
