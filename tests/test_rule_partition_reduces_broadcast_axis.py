"""partition-reduces-broadcast-axis (GD414): the forward recurrences broadcast_reductions reads
as reducing over the axis their previous scores are broadcast along, and the rule over a
trace's backwards."""

from __future__ import annotations

import ast
from textwrap import dedent

from graddoctor.analysis import Analysis
from graddoctor.rules import find_rule
from graddoctor.rules.partition_reduces_broadcast_axis import broadcast_axis, broadcast_reductions
from graddoctor.trace import TraceBuilder

CRF = dedent("""\
    class CRF:
        def partition(self, feats):
            alpha = feats[:, 0]
            for t in range(1, feats.size(1)):
                nxt = alpha[:, :, None] + self.trans + feats[:, t, None, :]
                alpha = torch.logsumexp(nxt, dim=2)
            return torch.logsumexp(alpha, 1)
    """)


def _expr(text):
    return ast.parse(text, mode="eval").body


def test_the_broadcast_axis_is_read_from_unsqueeze_and_none_subscripts():
    assert broadcast_axis(_expr("a.unsqueeze(2) + b"), "a") == (2, False)
    assert broadcast_axis(_expr("a.unsqueeze(-1) + b"), "a") == (-1, True)
    assert broadcast_axis(_expr("a[:, :, None] + b"), "a") == (2, False)
    assert broadcast_axis(_expr("a[..., None, :] + b"), "a") == (-2, True)
    assert broadcast_axis(_expr("a[:, 0] + b"), "a") is None
    assert broadcast_axis(_expr("c.unsqueeze(2) + b"), "a") is None


def test_a_reduction_over_the_broadcast_axis_is_found_through_a_scratch_name():
    assert [(line, function, carried, dim, other)
            for line, _, function, carried, dim, other in broadcast_reductions(ast.parse(CRF))] == \
        [(6, "partition", "alpha", 2, 1)]
    method = CRF.replace("torch.logsumexp(nxt, dim=2)", "nxt.logsumexp(2)")
    assert [r[4] for r in broadcast_reductions(ast.parse(method))] == [2]
    from_end = CRF.replace("alpha[:, :, None]", "alpha.unsqueeze(-1)").replace("dim=2", "dim=-1")
    assert [(r[4], r[5]) for r in broadcast_reductions(ast.parse(from_end))] == [(-1, -2)]


def test_the_other_axis_a_rank_left_open_or_a_max_is_silent():
    right = CRF.replace("dim=2", "dim=1")
    assert broadcast_reductions(ast.parse(right)) == []
    mixed = CRF.replace("dim=2", "dim=-1")  # unsqueeze at 2, dim from the end: rank unknown
    assert broadcast_reductions(ast.parse(mixed)) == []
    backward = CRF.replace("alpha[:, :, None]", "alpha[:, None, :]")
    assert broadcast_reductions(ast.parse(backward)) == []
    viterbi = CRF.replace("torch.logsumexp(nxt, dim=2)", "nxt.max(dim=2).values")
    assert broadcast_reductions(ast.parse(viterbi)) == []


def test_the_rule_reads_the_files_whose_backwards_ran(tmp_path):
    script = tmp_path / "crf.py"
    script.write_text(CRF + "loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=8)
    found = list(find_rule("partition-reduces-broadcast-axis")().check(Analysis(t.trace)))
    assert [(f.location.line, f.evidence["dim"]) for f in found] == [(6, 2)]
    assert "dim=1" in found[0].fix
    silent = TraceBuilder(str(script))
    assert list(find_rule("partition-reduces-broadcast-axis")().check(Analysis(silent.trace))) == []
