"""real-index-ignored (GD165): hand-written traces, the pure judgements of realindex.py, and the
watcher in-process over losses and embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.realindex import padding_inside, token_inside
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "real-index-ignored"


# -- the rule over hand-written events ----------------------------------------------------
def test_an_ignored_class_is_a_warning_naming_the_class():
    t = TraceBuilder()
    t.put(ev.real_index(argument="ignore_index", value=0, api="nn.CrossEntropyLoss", size=10,
                        layout="classes", share=0.1, median=0.1, classes=10, seen=256), 7)
    f = only(t, SLUG)
    assert f.severity.name == "WARNING" and f.location.line == 7
    assert "ignore_index=0" in f.message and "class 0 is never learned" in f.message
    assert "remove ignore_index=0" in f.fix


def test_a_padding_label_that_is_also_a_class_gets_the_relabel_fix():
    t = TraceBuilder()
    t.put(ev.real_index(argument="ignore_index", value=0, api="F.cross_entropy", size=5,
                        layout="padded rows", share=0.5, inside=40, content=80), 3)
    f = only(t, SLUG)
    assert "pads the label rows" in f.message and "-100" in f.fix


def test_a_padding_idx_token_says_its_vector_never_trains():
    t = TraceBuilder()
    t.put(ev.real_index(argument="padding_idx", value=1, api="nn.Embedding", size=50,
                        layout="tokens", share=0.15, median=0.02, inside=30, content=200), 4)
    f = only(t, SLUG)
    assert "padding_idx=1" in f.message and "never trains" in f.message


def test_no_event_no_finding():
    assert findings(TraceBuilder(), SLUG) == []


# -- the judgements ----------------------------------------------------------------------
def _rows(lengths, width=12, fill=0, inner=0.0, seed=0):
    """Rows of labels 1..4 right-padded with ``fill``; ``inner``: share of the content set to
    ``fill`` too."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.full((len(lengths), width), fill)
    for i, n in enumerate(lengths):
        row = torch.randint(1, 5, (n,), generator=g)
        row[torch.rand(n, generator=g) < inner] = fill
        row[0] = 1  # the row starts with content
        row[-1] = 2  # ... and ends with it: the run at the end is the padding
        rows[i, :n] = row
    return rows


def test_a_label_that_only_pads_is_not_inside():
    assert padding_inside(_rows([12, 5, 8, 3, 9]), 0) is None


def test_a_label_that_pads_and_stands_inside_is_found():
    found = padding_inside(_rows([12, 5, 8, 7, 9], inner=0.5), 0)
    assert found is not None and found["layout"] == "padded rows" and found["share"] > 0.2


def _text(rows=8, width=24, vocab=40, word=1, share=0.15, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (rows, width), generator=g)
    ids[torch.rand(rows, width, generator=g) < share] = word
    return ids


def test_a_frequent_word_as_padding_idx_is_a_token():
    found = token_inside(_text(), 1, 40)
    assert found is not None and found["layout"] == "tokens"


def _sequence_first(share):
    ids = _text(share=share).t().contiguous()  # (length, batch)
    for column, n in enumerate([24, 10, 15, 6, 20, 12, 9, 18]):
        ids[n:, column] = 1
    return ids


def test_sequence_first_padding_is_read_down_the_columns():
    assert token_inside(_sequence_first(0.0), 1, 40) is None
    found = token_inside(_sequence_first(0.15), 1, 40)  # the word inside the sequences too
    assert found is not None and 100 < found["content"] <= 114  # the columns hold 114 tokens


def test_padding_between_segments_comes_in_runs_and_is_no_token():
    ids = _text(share=0.0, width=16)
    for r, (q, p) in enumerate([(2, 4), (3, 9), (5, 6), (2, 8), (4, 5), (3, 7), (2, 9), (4, 4)]):
        ids[r, q:6] = 1
        ids[r, 6 + p:] = 1
    assert token_inside(ids, 1, 40) is None


def test_a_rare_padding_id_inside_is_no_token():
    ids = _text(share=0.0, rows=16)
    ids[2, 5] = ids[7, 11] = ids[12, 3] = 1  # 3 of 384 (an unknown word mapped to it)
    assert token_inside(ids, 1, 40) is None


# -- the watcher in-process ------------------------------------------------------------------
def _events(run):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        run()
    return [e for e in rec.trace if e.kind == "real_index"]


def _classify(labels, loss):
    head = nn.Linear(6, 10)
    g = torch.Generator().manual_seed(1)
    for batch in labels.split(64):
        loss(head(torch.randn(len(batch), 6, generator=g)), batch).backward()


def test_a_module_ignoring_a_balanced_class_points_at_its_construction():
    labels = torch.arange(256) % 10
    holder = {}

    def run():
        holder["loss"] = nn.CrossEntropyLoss(ignore_index=0)
        _classify(labels, holder["loss"])

    (e,) = _events(run)
    assert e["layout"] == "classes" and e["value"] == 0 and e["api"] == "nn.CrossEntropyLoss"
    assert e.loc is not None and e.loc.function == "run"


def test_a_rare_unlabelled_marker_is_silent():
    labels = 1 + torch.arange(512) % 9
    labels[::40] = 0  # 2.5%, 13 of the labels read; a class has 11%
    assert _events(lambda: _classify(labels, nn.CrossEntropyLoss(ignore_index=0))) == []


def test_an_index_outside_the_classes_or_negative_is_silent():
    labels = torch.arange(256) % 10
    labels[::7] = 255
    assert _events(lambda: _classify(labels, nn.CrossEntropyLoss(ignore_index=255))) == []
    labels[::7] = -100
    assert _events(lambda: _classify(labels, nn.CrossEntropyLoss())) == []


def test_a_flattened_tag_batch_is_read_as_rows():
    tags = _rows([12, 5, 8, 7, 9], inner=0.5)

    def run():
        scores = nn.Linear(3, 5)(torch.randn(5, 12, 3))
        F.cross_entropy(scores.reshape(-1, 5), tags.reshape(-1), ignore_index=0).backward()

    (e,) = _events(run)
    assert e["layout"] == "padded rows" and e["api"] == "F.cross_entropy"


def test_a_token_loss_ignoring_its_embeddings_pad_id_is_silent():
    ids = _text(vocab=40, share=0.0)
    labels = torch.where(torch.rand(ids.shape) < 0.3, ids, torch.zeros_like(ids))  # masked-LM labels

    def run():
        emb, head = nn.Embedding(40, 4, padding_idx=0), nn.Linear(4, 40)
        F.cross_entropy(head(emb(ids)).reshape(-1, 40), labels.reshape(-1), ignore_index=0).backward()

    assert _events(run) == []


def test_an_embedding_whose_padding_idx_is_a_word():
    ids = _text()

    def run():
        emb = nn.Embedding(40, 4, padding_idx=1)
        emb(ids).sum().backward()

    (e,) = _events(run)
    assert e["argument"] == "padding_idx" and e["api"] == "nn.Embedding" and e["layout"] == "tokens"


def test_a_categorical_feature_padded_with_a_real_category_is_found():
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 7, (48,), generator=g) for _ in range(4)]

    def run():
        emb = nn.Embedding(7, 4, padding_idx=0)
        for ids in batches:  # counted over the calls: 48 ids a call, 128 needed
            emb(ids).sum().backward()

    (e,) = _events(run)
    assert (e["layout"], e["value"], e["seen"]) == ("categories", 0, 144)
    assert e["classes"] == 7 and 0.05 < e["share"] < 0.3


def test_a_rare_missing_category_or_a_few_ids_are_not_judged():
    g = torch.Generator().manual_seed(0)
    shifted = torch.randint(1, 8, (256,), generator=g)
    shifted[:5] = 0  # missing, 2%
    assert _events(lambda: nn.Embedding(8, 4, padding_idx=0)(shifted).sum().backward()) == []
    few = torch.randint(0, 7, (64,), generator=g)  # under 128 ids in all
    assert _events(lambda: nn.Embedding(7, 4, padding_idx=0)(few).sum().backward()) == []
    two = torch.randint(0, 2, (256,), generator=g)  # two categories: a flag, not judged
    assert _events(lambda: nn.Embedding(2, 4, padding_idx=0)(two).sum().backward()) == []


def test_a_categories_event_says_the_row_never_trains(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import torch\nemb = torch.nn.Embedding(7, 4, padding_idx=0)\n")
    t = TraceBuilder(str(path))
    t.put(ev.real_index(argument="padding_idx", value=0, api="nn.Embedding", size=7,
                        layout="categories", share=0.14, median=0.14, classes=7, seen=256), 2)
    f = only(t, SLUG)
    assert "real category" in f.message and "never trains" in f.message
    assert f.fix.startswith("drop padding_idx=0")


def test_a_binary_tasks_negatives_are_a_class():
    labels = (torch.arange(256) % 5 < 2).long()  # 40% positives
    head = nn.Linear(6, 2)

    def run():
        g = torch.Generator().manual_seed(2)
        for batch in labels.split(64):
            F.cross_entropy(head(torch.randn(len(batch), 6, generator=g)), batch,
                            ignore_index=0).backward()

    (e,) = _events(run)
    assert e["layout"] == "classes" and e["classes"] == 2


def test_nothing_is_read_after_the_first_steps():
    labels = torch.arange(256) % 10

    def run():
        head = nn.Linear(6, 10)
        optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
        loss = nn.CrossEntropyLoss(ignore_index=0)
        for _ in range(16):
            optimizer.step()
        for batch in labels.split(64):
            loss(head(torch.randn(len(batch), 6)), batch).backward()

    assert _events(run) == []
