"""trains-on-evaluation-data (GD256): the names that mark held-out data, the loop's names read
from the source (analysis/source.py), and the rule over hand-written traces with a script."""

from __future__ import annotations

import textwrap

from graddoctor.analysis import Analysis
from graddoctor.analysis.source import loop_names
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.trains_on_evaluation_data import _held_out
from graddoctor.trace import TraceBuilder

SLUG = "trains-on-evaluation-data"


def test_held_out_names_are_told_apart_from_look_alikes():
    for name in ("val_loader", "valid_dl", "test_loader", "testloader", "eval_data", "validate",
                 "evaluate", "run_validation", "valLoader", "dev_set", "holdout"):
        assert _held_out(name), name
    for name in ("train_loader", "trainval_loader", "interval", "finetune_loader", "query_loader",
                 "loader", "evaluator_model", "latest", "train_and_evaluate", "", None):
        assert not _held_out(name), name


SCRIPT = """\
def validate(loader):
    for i, (x, y) in enumerate(tqdm(loader)):
        pass
for x, y in train_loader:
    pass
for batch in self.val_loader:
    pass
for x in make_batches():
    pass
"""


def test_the_loop_names_are_read_through_enumerate_and_tqdm(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    assert loop_names(str(path), 2) == ("loader", "validate")
    assert loop_names(str(path), 4) == ("train_loader", None)
    assert loop_names(str(path), 6) == ("val_loader", None)
    assert loop_names(str(path), 8) == (None, None)
    assert loop_names(str(path), 3) is None  # no loop there


LOOPS = """\
for x, y in train_loader:
    step()
for x, y in val_loader:
    step()
"""


def _run(tmp_path, *, val_steps=True, train_steps=True, loops=LOOPS):
    (tmp_path / "train.py").write_text(textwrap.dedent(loops))
    t = TraceBuilder(path="train.py")
    t.optimizer(0, [0, 1], line=1)
    t.event("epoch_start", 1, loader=0, epoch=0, real_len=2, replay_len=2)
    for i in range(2):
        t.clear([0, 1], line=2)
        t.backward(fresh=[0, 1], line=2, batch=[0, 0, i])
        if train_steps:
            t.step(line=2)
    t.event("epoch_start", 3, loader=1, epoch=0, real_len=2, replay_len=2)
    for i in range(2):
        t.clear([0, 1], line=4)
        t.backward(fresh=[0, 1], line=4, batch=[1, 0, i])
        if val_steps:
            t.step(line=4)
    return list(find_rule(SLUG)().check(Analysis(t.trace, base_dir=str(tmp_path))))


def test_steps_on_the_validation_loaders_batches_are_a_warning(tmp_path):
    found = _run(tmp_path)
    assert len(found) == 1
    f = found[0]
    assert f.severity is Severity.WARNING and f.location.line == 4
    assert "the batches of `val_loader`" in f.message and "2 backwards applied" in f.message


def test_no_step_on_held_out_batches_or_no_other_training_data_is_silent(tmp_path):
    assert _run(tmp_path, val_steps=False) == []  # backwards cleared before any step
    assert _run(tmp_path, train_steps=False) == []  # the held-out loader trains alone: TTA
    assert _run(tmp_path, loops=LOOPS.replace("val_loader", "finetune_loader")) == []


# -- full-batch losses over the rows the script evaluates on --------------------------------

from graddoctor.analysis.source import loss_row_selections  # noqa: E402
from graddoctor.rules.trains_on_evaluation_data import (  # noqa: E402
    _evaluation_selection, _training_rows)


def test_a_selection_is_evaluation_by_its_index_name_or_its_no_grad_evaluation_code():
    assert _evaluation_selection(["test_mask"], False, None)
    assert _evaluation_selection(["data.val_mask"], False, "train")  # pygcn: val inside train()
    assert _evaluation_selection(["idx_test"], False, None)
    assert _evaluation_selection(["mask"], True, "test")  # PyG: for mask in [...] under no_grad
    assert _evaluation_selection(["te"], True, None)
    assert _evaluation_selection(["idx"], False, "evaluate")
    assert not _evaluation_selection(["train_mask"], True, "test")  # a training accuracy
    assert not _evaluation_selection(["idx"], False, None)  # neutral, with a gradient
    assert not _evaluation_selection(["mask"], True, "train_epoch")
    assert not _evaluation_selection(["order"], True, None)  # sorted for a plot
    assert not _evaluation_selection(["sorted_idx"], True, None)


def test_the_training_rows_are_named_as_the_script_names_them():
    names = ["data", "data.train_mask", "data.test_mask", "train_mask", "y"]
    assert _training_rows(names, "data.test_mask") == "data.train_mask"
    assert _training_rows(["idx_train", "idx_test", "labels"], "idx_test") == "idx_train"
    assert _training_rows(["y", "test_mask"], "test_mask") == "train_mask"
    assert _training_rows(["Y", "te"], "te") == "train_idx"
    assert _training_rows(["trainer", "train_loss"], "te") == "train_idx"  # no rows named


ROWS = """\
import torch
y = torch.zeros(10)
y_train = y.clone()
y_train[~train_mask] = -100
for epoch in range(3):
    loss = F.cross_entropy(out, y)
    loss2 = crit(out, y_train.float().view(-1, 1), weight=w)
with torch.no_grad():
    acc = (out[test_mask] == y[test_mask]).float().mean()
    first = y[0], y[:5], y[..., 1]
def fit(model, y):
    loss = F.mse_loss(model(x), y)
    return y[idx_test]
def report(y):
    return y[test_mask]
"""


def test_loss_row_selections_reads_the_target_and_its_selections_in_the_same_binding(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(ROWS)
    found = loss_row_selections(str(path), 6)
    assert found["target"] == "y" and found["prediction"] == "out"
    assert found["call"] == "F.cross_entropy" and not found["more"]
    # constants, slices and the parameter `y` of report() are not the module's rows
    assert [s[:5] for s in found["selections"]] == [(9, "y[test_mask]", "test_mask", ["test_mask"], True)]
    assert "train_mask" in found["names"]
    other = loss_row_selections(str(path), 7)
    assert other["target"] == "y_train" and other["more"]
    assert other["written"] == "y_train.float().view(-1, 1)"
    assert other["selections"] == []  # y_train[~train_mask] is written, not read
    local = loss_row_selections(str(path), 12)
    assert [s[1] for s in local["selections"]] == ["y[idx_test]"]  # fit's own `y` only
    assert loss_row_selections(str(path), 2) is None  # torch.zeros(10): no target argument


FULL_BATCH = """\
for epoch in range(3):
    opt.zero_grad()
    loss = F.cross_entropy(out, y)
    loss.backward()
    opt.step()
with torch.no_grad():
    acc = (out[{index}] == y[{index}]).float().mean()
"""


def _full_batch(tmp_path, index="test_mask", steps=True):
    (tmp_path / "train.py").write_text(FULL_BATCH.format(index=index))
    t = TraceBuilder(path="train.py")
    t.optimizer(0, [0, 1], line=1)
    t.event("full_rows_loss", 3, fn="cross_entropy", rows=60)
    for _ in range(2):
        t.clear([0, 1], line=2)
        t.backward(fresh=[0, 1], line=4)
        if steps:
            t.step(line=5)
    return list(find_rule(SLUG)().check(Analysis(t.trace, base_dir=str(tmp_path))))


def test_a_full_batch_loss_over_the_evaluated_rows_is_a_warning_at_the_loss(tmp_path):
    found = _full_batch(tmp_path)
    assert len(found) == 1
    f = found[0]
    assert f.severity is Severity.WARNING and f.location.line == 3
    assert "all 60 rows of `y`" in f.message and "`y[test_mask]`, line 7" in f.message
    assert f.fix == ("index the loss with the training rows: "
                     "F.cross_entropy(out[train_mask], y[train_mask])")
    assert [r.location.line for r in f.related] == [7]


def test_a_full_batch_loss_is_silent_without_a_step_or_an_evaluation_selection(tmp_path):
    assert _full_batch(tmp_path, steps=False) == []
    assert _full_batch(tmp_path, index="train_mask") == []  # a training accuracy
    assert _full_batch(tmp_path, index="order") == []  # the rows sorted, not a subset


def _loader_rows(build):
    """The ``loader_rows`` events of iterating the loaders ``build()`` makes, in order."""
    from graddoctor.instrument import Instrumentation
    from graddoctor.instrument.recorder import Recorder

    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        for loader in build():
            iter(loader)
    return [dict(e.data) for e in rec.trace if e.kind == "loader_rows"]


def test_each_loader_s_rows_of_its_base_and_those_it_shares():
    import torch
    from torch.utils.data import DataLoader, Subset, SubsetRandomSampler, TensorDataset, random_split

    data = TensorDataset(torch.arange(100.0))

    def two_splits():
        train, _ = random_split(data, [80, 20], generator=torch.Generator().manual_seed(0))
        _, val = random_split(data, [80, 20], generator=torch.Generator().manual_seed(1))
        return DataLoader(train), DataLoader(val)

    first, second = _loader_rows(two_splits)
    assert (first["rows"], first["shared"], second["rows"]) == (80, [], 20)
    [[other, count]] = second["shared"]
    assert other == first["loader"] and 0 < count <= 20

    def disjoint():
        part = Subset(data, list(range(50)))
        return (DataLoader(Subset(part, list(range(40)))),
                DataLoader(data, sampler=SubsetRandomSampler(list(range(60, 80)))),
                DataLoader(Subset(part, list(range(40, 50)))))

    assert [e["shared"] for e in _loader_rows(disjoint)] == [[], [], []]

    def whole_and_part():
        return DataLoader(data), DataLoader(Subset(data, [1, 2, 3]))

    [part] = _loader_rows(whole_and_part)  # the whole dataset, first, shares nothing yet
    assert part["rows"] == 3 and part["shared"] == [[0, 3]]


def test_copied_rows_in_two_datasets_are_found_by_their_values():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    table = torch.randn(60, 5)
    labels = torch.randint(0, 2, (60,))

    def overlapping():
        return (DataLoader(TensorDataset(table[:40], labels[:40])),
                DataLoader(TensorDataset(table[30:], labels[30:])))

    [second] = _loader_rows(overlapping)  # the first, a whole dataset that copies nothing yet, says nothing
    assert second["copied"] == [[0, 10]] and second["shared"] == []

    def disjoint():
        return (DataLoader(TensorDataset(table[:40], labels[:40])),
                DataLoader(TensorDataset(table[40:], labels[40:])))

    assert _loader_rows(disjoint) == []

    categories = torch.randint(0, 2, (60, 3)).float()  # few values: equal rows are not copies

    def categorical():
        return (DataLoader(TensorDataset(categories[:40])), DataLoader(TensorDataset(categories[30:])))

    assert _loader_rows(categorical) == []


def test_split_slices_find_two_slices_of_one_sequence_that_overlap(tmp_path):
    from graddoctor.analysis.source import split_slices

    path = tmp_path / "train.py"
    path.write_text("perm = torch.randperm(100)\ntrain_idx, val_idx = perm[:80], perm[60:]\n"
                    "x_train = X[:50]\nx_test = X[50:]\n")
    assert split_slices(str(path)) == [(2, "val_idx", "perm[60:]", "train_idx", "perm[:80]")]
    path.write_text("train_idx = perm[:n]\nval_idx = perm[n - 10:]\n")  # not constant: not read
    assert split_slices(str(path)) == []


def test_the_inputs_and_labels_split_alike_point_at_the_first_slice(tmp_path):
    from graddoctor.rules.trains_on_evaluation_data import _overlapping_split

    path = tmp_path / "train.py"
    path.write_text("X_train, X_valid = X[:1600], X[1400:]\nY_train, Y_valid = Y[:1600], Y[1400:]\n")

    class _A:
        from graddoctor.analysis.source import ScriptSource
        source = ScriptSource()

    assert _overlapping_split(_A(), str(path)) == (1, "X_valid", "X[1400:]", "X_train", "X[:1600]")
    path.write_text("X_train, X_valid = X[:1600], X[1400:]\nY_train, Y_valid = Y[:1500], Y[1300:]\n")
    assert _overlapping_split(_A(), str(path)) is None  # sliced at other bounds: which one is meant?
