"""mask-filled-both-ways (GD432): the source reading over scripts written to a temporary folder,
and the rule over a trace whose backward ran in them."""

from __future__ import annotations

import textwrap

from graddoctor.analysis.mask_polarity import mixed_polarity_fills
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "mask-filled-both-ways"

SPANS = """\
import torch
for ids, ctx_mask, s, e in loader:
    start, end = model(ids).unbind(-1)
    start = start.masked_fill(ctx_mask, -1e4)
    end = end.masked_fill(~ctx_mask, -1e4)
    loss = F.cross_entropy(start, s) + F.cross_entropy(end, e)
    loss.backward()
"""


def _script(tmp_path, text):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _trace(path, line=7):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=1)
    for _ in range(2):
        t.backward(fresh=P, line=line)
        t.step(line=line)
    return t


def test_a_validity_mask_given_as_it_is_beside_its_complement_is_reported(tmp_path):
    f = only(_trace(_script(tmp_path, SPANS)), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 4
    assert [r.location.line for r in f.related] == [5]
    assert "start.masked_fill(~ctx_mask, -1e4)" in f.fix


def test_one_polarity_everywhere_is_silent(tmp_path):
    text = SPANS.replace("masked_fill(ctx_mask", "masked_fill(~ctx_mask")
    assert findings(_trace(_script(tmp_path, text)), SLUG) == []


def test_a_padding_mask_complemented_is_the_wrong_one(tmp_path):
    path = _script(tmp_path, """\
        def pool(h, pad_mask):
            a = h.masked_fill(pad_mask[..., None], float("-inf")).max(1).values
            b = h.masked_fill(~pad_mask[..., None], torch.finfo(h.dtype).min).amax(1)
            return a + b
        """)
    [found] = mixed_polarity_fills(path)
    assert found["line"] == 3 and found["complemented"] and found["other_line"] == 2


def test_pair_masks_zero_fills_and_inline_comparisons_are_silent(tmp_path):
    path = _script(tmp_path, """\
        pos = d.masked_fill(~pos_mask, -1e9).max(1).values
        neg = d.masked_fill(pos_mask, -1e9).max(1).values
        h = h.masked_fill(mask, 0.0) + h.masked_fill(~mask, 0.0)
        s = s.masked_fill(ids == PAD, -1e9) + s.masked_fill(~(ids == PAD), -1e9)
        z = z.masked_fill(mask == 0, float("-inf"))
        """)
    assert mixed_polarity_fills(path) == []


def test_a_complement_written_as_an_equality_with_zero_counts(tmp_path):
    path = _script(tmp_path, """\
        a = s.masked_fill(attention_mask == 0, float("-inf"))
        b = t.masked_fill(attention_mask.unsqueeze(1), float("-inf"))
        """)
    [found] = mixed_polarity_fills(path)
    assert found["line"] == 2 and not found["complemented"]
