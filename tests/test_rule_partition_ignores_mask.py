"""partition-ignores-mask (GD100): the forward algorithms partitions_ignoring_masks reads as
given a mask they never read, and the rule over a trace's backwards."""

from __future__ import annotations

import ast
from textwrap import dedent

from graddoctor.analysis import Analysis
from graddoctor.rules import find_rule
from graddoctor.rules.partition_ignores_mask import partitions_ignoring_masks
from graddoctor.trace import TraceBuilder

CRF = dedent("""\
    class CRF:
        def partition(self, feats, mask):
            alpha = feats[:, 0]
            for t in range(1, feats.size(1)):
                nxt = torch.logsumexp(alpha.unsqueeze(2) + self.trans + feats[:, t].unsqueeze(1), 1)
                alpha = nxt
            return torch.logsumexp(alpha, 1)

        def gold(self, feats, tags, mask):
            return (feats.gather(2, tags[..., None]).squeeze(2) * mask).sum(1)
    """)


def test_a_forward_algorithm_that_never_reads_its_mask_is_found_at_its_carry():
    found = partitions_ignoring_masks(ast.parse(CRF))
    assert [(line, function, mask, sibling, carried, step)
            for line, _, function, mask, sibling, carried, step in found] == \
        [(6, "partition", "mask", 9, "alpha", "t")]


def test_a_read_mask_no_sibling_reading_one_or_no_recurrence_is_silent():
    read = CRF.replace("alpha = nxt", "alpha = torch.where(mask[:, t, None], nxt, alpha)")
    assert partitions_ignoring_masks(ast.parse(read)) == []
    no_sibling = CRF.replace("* mask).sum(1)", ").sum(1)")
    assert partitions_ignoring_masks(ast.parse(no_sibling)) == []
    no_recurrence = CRF.replace("torch.logsumexp(alpha.unsqueeze(2)", "torch.max(alpha.unsqueeze(2)")
    assert partitions_ignoring_masks(ast.parse(no_recurrence)) == []


def test_the_rule_reads_the_files_whose_backwards_ran(tmp_path):
    script = tmp_path / "crf.py"
    script.write_text(CRF + "loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=12)
    found = list(find_rule("partition-ignores-mask")().check(Analysis(t.trace)))
    assert [(f.location.line, f.evidence["mask"]) for f in found] == [(6, "mask")]
    assert "alpha = torch.where(mask[:, t].unsqueeze(1), nxt, alpha)" in found[0].fix


def test_the_carry_is_followed_through_scratch_names_to_the_loop_carried_name():
    through = dedent("""\
        class CRF:
            def partition(self, feats, mask):
                score = feats[:, 0]
                for t in range(1, feats.size(1)):
                    nxt = score[:, :, None] + self.trans + feats[:, t, None, :]
                    nxt = torch.logsumexp(nxt, dim=1)
                    score = nxt
                return torch.logsumexp(score, 1)

            def gold(self, feats, tags, mask):
                return (feats.gather(2, tags[..., None]).squeeze(2) * mask).sum(1)
        """)
    found = partitions_ignoring_masks(ast.parse(through))
    assert [(line, carried) for line, _, _, _, _, carried, _ in found] == [(7, "score")]
