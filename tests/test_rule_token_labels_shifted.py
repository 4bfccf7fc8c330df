"""token-labels-shifted (GD322): a tagger's labels laid one position off its tokens, read from the
loss's graph at the first backwards (instrument/tokenlabels.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.tokenlabels import shifted_end
from graddoctor.trace import TraceBuilder

PAD, CLS, SEP = 0, 1, 2


def _batch(shift: int, rows: int = 8, cls_tag=None):
    """Right-padded rows [CLS] w1..wk [SEP] and their tags, laid ``shift`` positions off."""
    g = torch.Generator().manual_seed(0)
    ids = torch.full((rows, 12), PAD)
    labels = torch.full((rows, 12), -100)
    for i in range(rows):
        k = 3 + i % 5
        words = torch.randint(3, 30, (k,), generator=g)
        ids[i, :k + 2] = torch.cat([torch.tensor([CLS]), words, torch.tensor([SEP])])
        labels[i, 1 + shift:k + 1 + shift] = words % 4
        if cls_tag is not None:
            labels[i, 0] = cls_tag
    return ids, labels


def test_labels_one_position_off_are_found_at_either_end():
    ids, labels = _batch(-1)
    assert shifted_end(ids, labels, -100, PAD)[0] == "first"
    ids, labels = _batch(1)
    assert shifted_end(ids, labels, -100, PAD)[0] == "last"


def test_aligned_labels_and_a_constant_tag_on_cls_are_not():
    ids, labels = _batch(0)
    assert shifted_end(ids, labels, -100, PAD) is None
    ids, labels = _batch(0, cls_tag=0)  # an "O" on [CLS]: constant, not another word's
    assert shifted_end(ids, labels, -100, PAD) is None


def test_padding_the_loss_counts_or_no_padding_says_nothing():
    ids, labels = _batch(-1)
    counted = labels.clone()
    counted[ids == PAD] = 0  # the labels are not laid out on these ids' padding
    assert shifted_end(ids, counted, -100, PAD) is None
    full = ids[:, :4].clone()  # no row padded
    assert shifted_end(full, labels[:, :4], -100, None) is None


def _events(shift: int, classes: int = 4):
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        emb = nn.Embedding(30, 8, padding_idx=PAD)
        rnn = nn.GRU(8, 8, batch_first=True, bidirectional=True)
        head = nn.Linear(16, classes)
        params = [*emb.parameters(), *rnn.parameters(), *head.parameters()]
        for _ in range(3):
            ids, labels = _batch(shift)
            loss = F.cross_entropy(head(rnn(emb(ids))[0]).reshape(-1, classes), labels.reshape(-1))
            for p in params:
                p.grad = None
            loss.backward()
            with torch.no_grad():
                for p in params:
                    p.add_(p.grad, alpha=-0.1)
    return [e for e in rec.trace if e.kind == "token_labels_shifted"]


def test_a_tagger_whose_labels_are_off_is_recorded_once_per_line():
    events = _events(-1)
    assert [(e["end"], e["classes"], e["vocab"]) for e in events] == [("first", 4, 30)]
    assert _events(0) == []
    assert _events(-1, classes=30) == []  # as many classes as tokens: a language model


def test_the_rule_reports_at_the_backward(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    script = tmp_path / "tagger.py"
    script.write_text("labels = build()\nloss = criterion(logits, labels)\nloss.backward()\n")
    t = TraceBuilder(str(script))
    t.put(ev.token_labels_shifted(end="first", rows=16, values=4, classes=5, vocab=64), 3)
    found = list(find_rule("token-labels-shifted")().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [3]
    assert "one position off" in found[0].message and "[CLS]" in found[0].message
