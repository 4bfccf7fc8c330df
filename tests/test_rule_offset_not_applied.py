"""offset-not-applied (GD295): the source search for loops that cut a flat tensor with a
running offset they never apply, and the rule over a trace whose backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.offset_not_applied import offsets_not_applied
from graddoctor.trace import TraceBuilder

SLUG = "offset-not-applied"


def _found(src: str):
    return [(h["line"], h["kind"], h["cursor"]) for h in offsets_not_applied(ast.parse(src))]


def test_offsets_never_applied_are_found_at_the_slice():
    assert _found("params, off = [], 0\nfor s in shapes:\n    n = s.numel()\n"
                  "    params.append(flat[:n].view(s))\n    off += n\n") == [(4, "unread", "off")]
    assert _found("pos = 0\nfor s in shapes:\n    k = s.numel()\n"
                  "    out.append(flat[pos:pos + k])\n") == [(4, "frozen", "pos")]


def test_applied_offsets_stay_silent():
    for src in (
        "off = 0\nfor s in shapes:\n    n = s.numel()\n    w.append(flat[off:off + n])\n    off += n\n",
        "off = 0\nfor s in shapes:\n    n = s.numel()\n    w.append(buf[:n])\n    buf = buf[n:]\n    off += n\n",
        "off = 0\nfor s in shapes:\n    n = s.numel()\n    w.append(flat.narrow(0, off, n))\n    off += n\n",
        "for p in ps:\n    n = p.numel()\n    p.grad = g[:n].view_as(p)\n    offset += n\n",   # no cursor start
        "total = 0\nfor x in xs:\n    h = f(x)\n    y.append(h[:n])\n    total += n\n",             # a fresh tensor each pass
        "seen = 0\nfor b in batches:\n    y.append(flat[:k])\n    seen += len(b)\n",           # another size
        "total = 0\nfor b, p in enumerate(paths):\n    n = len(p)\n    c += (t[b, :n] == 1).sum()\n"
        "    total += n\nprint(c / total)\n",                                                   # a count
        "total = 0\nfor p in paths:\n    n = len(p)\n    c += tags[:n].sum()\n    total += n\nacc = c / total\n",
    ):
        assert _found(src) == [], src


def test_the_finding_is_a_warning_with_the_offset_in_the_fix(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("off = 0\n"
                      "for s in shapes:\n"
                      "    n = s.numel()\n"
                      "    ws.append(flat[:n])\n"
                      "    off += n\n"
                      "loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=6)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [4]
    assert found[0].severity is Severity.WARNING
    assert "flat[off:off + n]" in found[0].fix
