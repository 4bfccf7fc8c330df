"""collate-reorders-fields (GD311): the collate check of the augmentation watcher
(instrument/augalign.py: each batch field's rows matched to the samples they hold), over real
DataLoader fetches, and the rule over its events."""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import pack_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.augalign import _length_sources, _matched, _row_sources
from rule_traces import builder, findings, only

SLUG = "collate-reorders-fields"


class _Seqs(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = [torch.randint(1, 50, (int(n),), generator=g)
                  for n in torch.randint(2, 12, (16,), generator=g)]

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return self.x[i], i % 2


def _events(collate) -> list:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        for _ in DataLoader(_Seqs(), batch_size=8, collate_fn=collate):
            pass
    assert not rec.trace.of_kind("internal_error")
    return [dict(e.data) for e in rec.trace.of_kind("collate_reordered")]


def _sorted_inputs(batch):
    seqs = sorted([x for x, _ in batch], key=len, reverse=True)
    return pad_sequence(seqs, batch_first=True), torch.tensor([y for _, y in batch])


def _sorted_pairs(batch):
    batch = sorted(batch, key=lambda b: len(b[0]), reverse=True)
    return pad_sequence([x for x, _ in batch], batch_first=True), torch.tensor([y for _, y in batch])


def _packed_inputs(batch):
    seqs = sorted([x for x, _ in batch], key=len, reverse=True)
    return pack_sequence(seqs), torch.tensor([float(y) for _, y in batch])


def _kept(batch):
    lengths = torch.tensor([len(x) for x, _ in batch])
    return pad_sequence([x for x, _ in batch], batch_first=True), lengths, torch.tensor([y for _, y in batch])


def test_a_field_reordered_alone_is_found():
    (found,) = _events(_sorted_inputs)
    assert found["collate"] == "_sorted_inputs" and (found["moved"], found["kept"]) == (0, 1)
    assert found["rows"] == 8 and found["displaced"] > 0
    assert len(_events(_packed_inputs)) == 1


def test_whole_samples_reordered_or_kept_are_silent():
    assert _events(_sorted_pairs) == []
    assert _events(_kept) == []


def test_row_sources_match_padded_prefixes_and_numbers():
    values = [torch.tensor([1, 2]), torch.tensor([3, 4, 5])]
    padded = pad_sequence(values, batch_first=True)
    assert _row_sources(padded, values) == [{0}, {1}]
    assert _row_sources(padded.flip(0), values) == [{1}, {0}]
    assert _row_sources(torch.tensor([0.1, 0.7]), [0.7, 0.1]) == [{1}, {0}]
    assert _row_sources(torch.tensor([5, 6]), [0, 1]) is None  # lengths, not labels


def test_the_finding_names_the_fields_and_the_fix():
    t = builder()
    t.put(ev.collate_reordered(collate="collate", moved=0, kept=2, rows=16, displaced=13), 29)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 29
    assert "13 of its 16 rows" in f.message and "field 0" in f.message
    assert "sort the list of samples" in f.fix
    assert findings(builder(), SLUG) == []


class _TokenDicts(Dataset):
    """Samples as a tokenized dataset holds them: dicts of Python lists and an int label."""

    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.rows = [{"input_ids": torch.randint(1, 50, (int(n),), generator=g).tolist(), "labels": i % 2}
                     for i, n in enumerate(torch.randint(2, 12, (16,), generator=g))]

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return self.rows[i]


def _dict_events(collate) -> list:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        for _ in DataLoader(_TokenDicts(), batch_size=8, collate_fn=collate):
            pass
    assert not rec.trace.of_kind("internal_error")
    return [(dict(e.data), e.loc.line) for e in rec.trace.of_kind("collate_reordered")]


def _sorted_samples_labels_unsorted(features):
    ordered = sorted(features, key=lambda f: len(f["input_ids"]), reverse=True)
    ids = pad_sequence([torch.tensor(f["input_ids"]) for f in ordered], batch_first=True)
    labels = torch.tensor([f["labels"] for f in features])
    return {"input_ids": ids, "labels": labels}


def _sorted_samples_labels_sorted(features):
    ordered = sorted(features, key=lambda f: len(f["input_ids"]), reverse=True)
    ids = pad_sequence([torch.tensor(f["input_ids"]) for f in ordered], batch_first=True)
    return {"input_ids": ids, "labels": torch.tensor([f["labels"] for f in ordered])}


def test_token_lists_are_matched_and_the_unsorted_field_line_is_named():
    (found, line), = _dict_events(_sorted_samples_labels_unsorted)
    assert (found["moved"], found["kept"]) == ("input_ids", "labels") and found["displaced"] > 0
    first = _sorted_samples_labels_unsorted.__code__.co_firstlineno
    assert line == first + 3  # the labels built from the list as given, not the sort
    assert _dict_events(_sorted_samples_labels_sorted) == []


def test_row_sources_match_lists_of_numbers():
    assert _row_sources(pad_sequence([torch.tensor([3, 4, 5]), torch.tensor([1, 2])], batch_first=True),
                        [[1, 2], [3, 4, 5]]) == [{1}, {0}]


class _Sentences(Dataset):
    """Samples as a text dataset holds them: a list of words and a label; the collate encodes."""

    def __init__(self):
        g = torch.Generator().manual_seed(2)
        self.rows = [(["w%d" % int(v) for v in torch.randint(0, 9, (int(n),), generator=g)], i % 3)
                     for i, n in enumerate(torch.randint(2, 14, (16,), generator=g))]

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return self.rows[i]


def _word_events(collate) -> list:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        for _ in DataLoader(_Sentences(), batch_size=8, collate_fn=collate):
            pass
    assert not rec.trace.of_kind("internal_error")
    return [(dict(e.data), e.loc.line) for e in rec.trace.of_kind("collate_reordered")]


def _encode(words):
    return torch.tensor([1 + int(w[1:]) for w in words])


def _words_sorted_labels_not(batch):
    seqs = sorted([_encode(w) for w, _ in batch], key=len, reverse=True)
    lengths = torch.tensor([len(s) for s in seqs])
    return pad_sequence(seqs, batch_first=True), lengths, torch.tensor([y for _, y in batch])


def _words_pairs_sorted(batch):
    batch = sorted(batch, key=lambda b: len(b[0]), reverse=True)
    seqs = [_encode(w) for w, _ in batch]
    return pad_sequence(seqs, batch_first=True), torch.tensor([len(s) for s in seqs]), \
        torch.tensor([y for _, y in batch])


def _words_with_bos_kept(batch):
    seqs = [torch.cat([torch.tensor([99]), _encode(w)]) for w, _ in batch]
    return pad_sequence(seqs, batch_first=True), torch.tensor([y for _, y in batch])


def _words_with_bos_sorted(batch):
    seqs = sorted([torch.cat([torch.tensor([99]), _encode(w)]) for w, _ in batch], key=len)
    return pad_sequence(seqs, batch_first=True), torch.tensor([y for _, y in batch])


def test_words_encoded_in_the_collate_are_matched_by_their_lengths():
    (found, line), = _word_events(_words_sorted_labels_not)
    assert found["kept"] == 2 and found["moved"] in (0, 1) and found["displaced"] > 0
    assert line == _words_sorted_labels_not.__code__.co_firstlineno + 1  # the sort
    assert _word_events(_words_pairs_sorted) == []
    assert _word_events(_words_with_bos_kept) == []
    assert len(_word_events(_words_with_bos_sorted)) == 1  # a token added to each row: offset 1


def test_length_sources_need_the_lengths_one_for_one():
    words = [["a", "b"], ["c", "d", "e"], ["f"]]
    padded = pad_sequence([torch.tensor([4, 5, 6]), torch.tensor([1]), torch.tensor([2, 3])], batch_first=True)
    assert _length_sources(padded, words) == [{1}, {2}, {0}]
    assert _length_sources(torch.tensor([1, 3, 2]), words) == [{2}, {1}, {0}]
    assert _length_sources(torch.tensor([1, 3, 3]), words) is None  # not the samples' lengths
    assert _length_sources(padded.float(), words) is None  # not a field of token ids
    assert _length_sources(padded, [[1, 2], [3, 4, 5], [6]]) is None  # numbers: matched by value
    assert _length_sources(torch.tensor([2, 2]), [["a", "b"], ["c", "d"]]) is None  # all as long
    assert _length_sources(torch.tensor([2, 1]), ["a b", "c"]) == [{0}, {1}]  # a sentence's words


def test_matched_finds_one_order_that_fits_every_row():
    assert _matched([{0, 1}, {0}, {2}])
    assert not _matched([{0}, {0}, {1, 2}])
