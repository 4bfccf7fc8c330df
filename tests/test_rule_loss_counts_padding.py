"""loss-counts-padding (GD235): hand-written traces, and the loss watcher in-process over an
embedding with a padding_idx."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "loss-counts-padding"


def test_padding_not_ignored_is_a_warning_with_the_pad_in_the_fix():
    t = TraceBuilder()
    t.put(ev.loss_padding(fn="cross_entropy", pad=0, fraction=0.7, ignore_index=-100,
                          reduction="mean"), 12)
    f = only(t, SLUG)
    assert f.location.line == 12 and "70%" in f.message and "ignore_index=0" in f.fix


def test_an_ignore_index_that_never_matches_is_named():
    t = TraceBuilder()
    t.put(ev.loss_padding(fn="nll_loss", pad=29, fraction=0.5, ignore_index=-1, reduction="sum"), 3)
    assert "ignore_index=-1 never matches" in only(t, SLUG).message


def test_no_event_no_finding():
    assert findings(TraceBuilder(), SLUG) == []


def padded_losses(**loss_kw):
    rec = Recorder(step_budget=None)
    emb, head = nn.Embedding(10, 4, padding_idx=0), nn.Linear(4, 10)
    tokens = torch.zeros(4, 8, dtype=torch.long)
    tokens[:, :2] = torch.randint(1, 10, (4, 2))
    with Instrumentation(rec):
        logits = head(emb(tokens))
        F.cross_entropy(logits.reshape(-1, 10), tokens.reshape(-1), **loss_kw).sum().backward()
    return [e for e in rec.trace if e.kind == "loss_padding"]


def test_the_watcher_sees_mostly_padded_targets():
    (e,) = padded_losses()
    assert e.get("pad") == 0 and e.get("fraction") == 0.75


def test_the_watcher_is_silent_with_ignore_index_or_reduction_none():
    assert padded_losses(ignore_index=0) == []
    assert padded_losses(reduction="none") == []


def filled_losses(tokens, vocab=50):
    """A language model's loss over ``tokens`` with an embedding that has no padding_idx."""
    rec = Recorder(step_budget=None)
    emb, head = nn.Embedding(vocab, 4), nn.Linear(4, vocab)
    with Instrumentation(rec):
        logits = head(emb(tokens))
        F.cross_entropy(logits.reshape(-1, vocab), tokens.reshape(-1)).backward()
    return [e for e in rec.trace if e.kind == "loss_padding"]


def _right_padded(lengths, fill, width=12, vocab=50, left=False):
    g = torch.Generator().manual_seed(0)
    tokens = torch.full((len(lengths), width), fill)
    for i, n in enumerate(lengths):
        words = torch.randint(1, vocab - 1, (n,), generator=g)
        words[words == fill] = fill + 1
        if left:
            tokens[i, width - n:] = words
        else:
            tokens[i, :n] = words
    return tokens


@pytest.mark.parametrize("left", [False, True])
def test_an_id_filling_up_the_shorter_rows_is_taken_as_the_padding(left):
    # dynamic padding: the longest row (12) has none
    (e,) = filled_losses(_right_padded([3, 5, 12, 4, 2, 6], fill=0, left=left))
    assert e.get("pad") == 0 and e.get("source") == "fill" and e.get("fraction") > 0.5
    (e,) = filled_losses(_right_padded([3, 5, 7, 4, 2, 6], fill=49))  # an eos id as the pad
    assert e.get("pad") == 49


def test_no_fill_without_padding_evidence():
    g = torch.Generator().manual_seed(1)
    assert filled_losses(torch.randint(0, 50, (6, 12), generator=g)) == []  # unpadded tokens
    # a four-letter alphabet: the last column often agrees and runs happen, but the letter is
    # everywhere else too
    assert filled_losses(torch.randint(0, 4, (8, 16), generator=g), vocab=4) == []
    # rows of one length that all end with one eos: runs of 1
    tokens = torch.randint(1, 49, (6, 12), generator=g)
    tokens[:, -1] = 49
    assert filled_losses(tokens) == []


def target_losses(targets, decoder_inputs, vocab=50, next_token=False, **loss_kw):
    """A decoder's loss over ``targets`` whose own inputs (``decoder_inputs``, no padding_idx)
    give no fill id away: only the targets can. ``next_token``: the loss of positions 1.. of
    the targets from the logits of positions ..-1 (one shorter than the embedded batch)."""
    rec = Recorder(step_budget=None)
    emb, head = nn.Embedding(vocab, 4), nn.Linear(4, vocab)
    with Instrumentation(rec):
        logits = head(emb(decoder_inputs))
        if next_token:
            logits, targets = logits[:, :-1], targets[:, 1:]
        F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), **loss_kw).backward()
    return [e for e in rec.trace if e.kind == "loss_padding"]


def _start_shifted(targets, start=0):
    return torch.cat([torch.full((targets.shape[0], 1), start), targets[:, :-1]], dim=1)


def test_targets_padded_with_the_start_token_are_read_from_the_targets():
    # T5's convention: the pad id is the decoder's start token, so every decoder input row starts
    # with it and the decoder inputs tell no fill id
    targets = _right_padded([3, 5, 7, 4, 2, 6], fill=0)
    assert filled_losses(_start_shifted(targets)) == []  # what the embedding's inputs tell
    (e,) = target_losses(targets, _start_shifted(targets))
    assert e.get("pad") == 0 and e.get("source") == "targets" and e.get("fraction") > 0.25
    (e,) = target_losses(targets, _start_shifted(targets), next_token=True)  # length - 1
    assert e.get("source") == "targets"


def test_padded_targets_ignored_or_of_another_vocabulary_stay_silent():
    targets = _right_padded([3, 5, 7, 4, 2, 6], fill=0)
    inputs = _start_shifted(targets)
    assert target_losses(targets, inputs, ignore_index=0) == []
    assert target_losses(targets.masked_fill(targets == 0, -100), inputs) == []
    # the targets' classes are not the embedded tokens' (50 token ids, 7 classes): no token loss
    rec = Recorder(step_budget=None)
    emb, head = nn.Embedding(50, 4), nn.Linear(4, 7)
    tags = _right_padded([3, 5, 7, 4, 2, 6], fill=0, vocab=7)
    with Instrumentation(rec):
        F.cross_entropy(head(emb(inputs)).reshape(-1, 7), tags.reshape(-1)).backward()
    assert [e for e in rec.trace if e.kind == "loss_padding"] == []
