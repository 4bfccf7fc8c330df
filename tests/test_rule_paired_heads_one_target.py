"""paired-heads-one-target (GD416): the calls paired_heads_one_target reads as training both
ends of a pair against one target, and the rule over a trace's backwards."""

from __future__ import annotations

import ast
from textwrap import dedent

from graddoctor.analysis import Analysis
from graddoctor.rules import find_rule
from graddoctor.rules.paired_heads_one_target import _swapped, _target_side, paired_heads_one_target
from graddoctor.trace import TraceBuilder

QA = dedent("""\
    def train_step(model, batch):
        start_logits, end_logits = model(batch["input_ids"])
        start_loss = F.cross_entropy(start_logits, batch["start_positions"])
        end_loss = F.cross_entropy(end_logits, batch["start_positions"])
        return (start_loss + end_loss) / 2
    """)


def test_pair_words_swapped_and_the_side_a_target_names():
    assert _swapped("start_logits", "end_logits") == ("start", "end")
    assert _swapped("out.headScores", "out.tailScores") == ("head", "tail")
    assert _swapped("logits", "aux_logits") is None
    assert _swapped("start_logits", "end_scores") is None
    assert _target_side('batch["start_positions"]', ("start", "end")) == "start"
    assert _target_side("sp", ("start", "end")) == "start"
    assert _target_side("labels", ("start", "end")) is None


def test_the_end_trained_on_the_start_target_is_found_at_its_call():
    found = paired_heads_one_target(ast.parse(QA))
    assert [(line, end, target) for line, _, _, end, target in found] == \
        [(4, "end", "batch['start_positions']")]
    swapped = QA.replace('end_logits, batch["start_positions"]', 'end_logits, batch["end_positions"]') \
        .replace('start_logits, batch["start_positions"]', 'start_logits, batch["end_positions"]')
    assert [(line, end) for line, _, _, end, _ in paired_heads_one_target(ast.parse(swapped))] == \
        [(3, "start")]


def test_own_targets_auxiliary_heads_and_constants_are_silent():
    own = QA.replace('end_logits, batch["start_positions"]', 'end_logits, batch["end_positions"]')
    assert paired_heads_one_target(ast.parse(own)) == []
    aux = dedent("""\
        def step(logits, aux_logits, y):
            return F.cross_entropy(logits, y) + 0.3 * F.cross_entropy(aux_logits, y)
        """)
    assert paired_heads_one_target(ast.parse(aux)) == []
    const = QA.replace('batch["start_positions"]', "0")
    assert paired_heads_one_target(ast.parse(const)) == []


def test_a_target_that_names_neither_end_is_a_shared_label():
    views = dedent("""\
        def step(left_logits, right_logits, scene_labels, head_scores, tail_scores, labels):
            loss = F.cross_entropy(left_logits, scene_labels) + F.cross_entropy(right_logits, scene_labels)
            return loss + F.binary_cross_entropy_with_logits(head_scores, labels) \\
                + F.binary_cross_entropy_with_logits(tail_scores, labels)
        """)
    assert paired_heads_one_target(ast.parse(views)) == []
    named = views.replace("scene_labels", "left_idx")
    assert [(line, end) for line, _, _, end, _ in paired_heads_one_target(ast.parse(named))] == \
        [(2, "right")]


def test_the_rule_reads_the_files_whose_backwards_ran(tmp_path):
    script = tmp_path / "qa.py"
    script.write_text(QA + "loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=6)
    found = list(find_rule("paired-heads-one-target")().check(Analysis(t.trace)))
    assert [(f.location.line, f.evidence["end"]) for f in found] == [(4, "end")]
    assert "end prediction its own target" in found[0].fix
