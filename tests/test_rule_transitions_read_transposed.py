"""transitions-read-transposed (GD415): the CRFs transposed_readings reads as scoring the gold
path with the transition matrix in the other orientation than their forward algorithm, and
the rule over a trace's backwards."""

from __future__ import annotations

import ast
from textwrap import dedent

from graddoctor.analysis import Analysis
from graddoctor.rules import find_rule
from graddoctor.rules.transitions_read_transposed import transposed_readings
from graddoctor.trace import TraceBuilder

CRF = dedent("""\
    class CRF:
        def partition(self, feats):
            alpha = feats[:, 0]
            for t in range(1, feats.size(1)):
                alpha = torch.logsumexp(alpha[:, :, None] + self.trans + feats[:, t, None, :], dim=1)
            return torch.logsumexp(alpha, 1)

        def gold(self, feats, tags):
            score = feats[:, 0].gather(1, tags[:, :1]).squeeze(1)
            for t in range(1, feats.size(1)):
                score = score + self.trans[tags[:, t], tags[:, t - 1]]
            return score
    """)


def test_a_gold_score_reading_the_matrix_the_other_way_is_found_at_its_read():
    found = transposed_readings(ast.parse(CRF))
    assert [(line, name, function, partition, rows_previous)
            for line, _, name, function, partition, rows_previous in found] == \
        [(11, "trans", "gold", 5, True)]
    sliced = CRF.replace("self.trans[tags[:, t], tags[:, t - 1]]", "self.trans[tags[:, 1:], tags[:, :-1]].sum(1)")
    assert [r[0] for r in transposed_readings(ast.parse(sliced))] == [11]


def test_both_sides_in_one_orientation_are_silent():
    same = CRF.replace("self.trans[tags[:, t], tags[:, t - 1]]", "self.trans[tags[:, t - 1], tags[:, t]]")
    assert transposed_readings(ast.parse(same)) == []
    transposed = CRF.replace("+ self.trans +", "+ self.trans.t() +")
    assert transposed_readings(ast.parse(transposed)) == []
    to_from = CRF.replace("alpha[:, :, None]", "alpha[:, None, :]").replace(
        "feats[:, t, None, :], dim=1", "feats[:, t, :, None], dim=2")
    assert transposed_readings(ast.parse(to_from)) == []
    next_step = CRF.replace("self.trans[tags[:, t], tags[:, t - 1]]", "self.trans[tags[:, t - 1], tags[:, t] + 0]")
    assert transposed_readings(ast.parse(next_step)) == []
    flat = CRF.replace("self.trans[tags[:, t], tags[:, t - 1]]", "self.trans.view(-1)[tags[:, t] * 5 + tags[:, t - 1]]")
    assert transposed_readings(ast.parse(flat)) == []


def test_the_rule_reads_the_files_whose_backwards_ran(tmp_path):
    script = tmp_path / "crf.py"
    script.write_text(CRF + "loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=13)
    found = list(find_rule("transitions-read-transposed")().check(Analysis(t.trace)))
    assert [(f.location.line, f.evidence["partition_line"]) for f in found] == [(11, 5)]
    assert "[from, to]" in found[0].fix
