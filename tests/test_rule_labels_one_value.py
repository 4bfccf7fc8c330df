"""labels-one-value: the watcher (instrument/constlabels.py) tells a loss line whose targets hold
one value over enough calls, judged on the loader's batches and the dataset's whole label
tensor; the source says which targets the script makes itself (analysis/source.py)."""

from __future__ import annotations

import textwrap

import torch
from torch.utils.data import TensorDataset

from graddoctor.analysis.source import target_origin
from graddoctor.instrument import constlabels
from graddoctor.instrument.constlabels import ConstantTargetsWatcher, dataset_labels, one_value
from graddoctor.trace import Location


class _Rec:
    def __init__(self):
        self.events, self.errors = [], []

    def here(self, skip=2):
        return Location("train.py", 7)

    def emit_aside(self, made, loc=None):
        self.events.append(made)

    def internal_error(self, where, exc):
        self.errors.append((where, exc))


class _Loaders:
    def __init__(self, dataset):
        self.dataset = dataset

    def dataset_of(self, number):
        return self.dataset


PRED = torch.zeros(16, 2, requires_grad=True)


def _run(targets, served=None, dataset=None):
    rec = _Rec()
    watcher = ConstantTargetsWatcher(rec, _Loaders(dataset))
    for i, target in enumerate(targets):
        if served is not None:
            watcher.served(0, 0, i, served[i])
        watcher.loss_call("cross_entropy", PRED, target)
    assert rec.errors == []
    return rec.events


def test_one_value():
    assert one_value(torch.zeros(5, dtype=torch.long)) == 0
    assert one_value(torch.full((2, 3), 2.5)) == 2.5
    assert one_value(torch.tensor([0, 0, 1])) is None
    assert one_value(torch.tensor([])) is None


def test_converted_targets_are_told_after_four_calls_and_64_values():
    zeros = torch.zeros(16, dtype=torch.long)
    rates = [(torch.rand(16), torch.rand(16)) for _ in range(8)]
    assert _run([zeros] * 3, rates) == []  # 3 calls: too few
    events = _run([zeros] * 4, rates)
    assert len(events) == 1 and events[0][0] == "constant_targets"
    assert events[0][1]["value"] == 0 and events[0][1]["basis"] == "converted"
    assert events[0][1]["calls"] == 4 and events[0][1]["values"] == 64
    assert events[0][1]["stage"] == "few"


def test_targets_of_several_values_are_not_told():
    assert _run([torch.randint(0, 3, (16,)) for _ in range(16)]) == []
    assert _run([torch.zeros(16, dtype=torch.long)] * 3 + [torch.ones(16, dtype=torch.long)] * 13) == []


def test_a_served_label_is_judged_on_the_whole_dataset():
    labels = torch.zeros(400, dtype=torch.long)
    batches = [(torch.randn(16, 3), torch.zeros(16, dtype=torch.long)) for _ in range(16)]
    targets = [b[1] for b in batches]
    labels[7] = 1  # a rare class the first batches miss
    assert _run(targets, batches, TensorDataset(torch.randn(400, 3), labels)) == []
    events = _run(targets, batches, TensorDataset(torch.randn(400, 3), torch.zeros(400, dtype=torch.long)))
    assert [(e[1]["basis"], e[1]["stage"], e[1]["calls"]) for e in events] == [("dataset-one", "few", 4)]


def test_served_labels_without_a_dataset_tensor_need_many_values():
    batches = [(torch.randn(32, 3), torch.zeros(32, dtype=torch.long)) for _ in range(16)]
    targets = [b[1] for b in batches]
    events = _run(targets, batches, dataset=None)
    assert [(e[1]["basis"], e[1]["stage"], e[1]["calls"], e[1]["samples"]) for e in events] == [
        ("served", "few", 4, 128), ("served", "many", 16, 512)]
    events = _run(targets[:15], batches, dataset=None)
    assert [e[1]["stage"] for e in events] == ["few"]  # 480 samples: a rare class may not have shown


def test_a_line_that_varies_after_being_told_is_told_again_as_varied():
    zeros = torch.zeros(16, dtype=torch.long)
    rates = [(torch.rand(16), torch.rand(16)) for _ in range(8)]
    events = _run([zeros] * 5 + [torch.ones(16, dtype=torch.long)], rates)
    assert [e[1]["stage"] for e in events] == ["few", "varied"]


def test_targets_with_a_gradient_or_too_many_values_are_not_read(monkeypatch):
    assert _run([torch.zeros(16, requires_grad=True)] * 8) == []
    monkeypatch.setattr(constlabels, "_MAX_VALUES", 8)
    assert _run([torch.zeros(16)] * 8) == []


def test_dataset_labels_picks_the_tensor_shaped_like_the_served_one():
    x, y = torch.randn(10, 3), torch.zeros(10, dtype=torch.long)
    assert dataset_labels(TensorDataset(x, y), torch.zeros(4, dtype=torch.long)) is y
    assert dataset_labels(TensorDataset(x, y), torch.zeros(4, 3)) is x
    assert dataset_labels(TensorDataset(x, y), torch.zeros(4, dtype=torch.int32)) is None


def _origin(tmp_path, code, line):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(code))
    return target_origin(str(path), line)


def test_targets_the_script_makes_are_told_apart_from_data(tmp_path):
    code = """\
    import torch
    import torch.nn.functional as F
    for x, y in loader:
        valid = torch.ones(x.size(0), 1)
        labels = torch.zeros(len(x), dtype=torch.long).to(x.device)
        target = y.long()
        a = F.bce(D(x), valid)
        b = F.cross_entropy(logits, labels)
        c = F.cross_entropy(model(x), target)
        d = F.cross_entropy(sim, torch.arange(len(x)))
        e = criterion(model(x), y)
    """
    assert _origin(tmp_path, code, 7)["made"] and _origin(tmp_path, code, 8)["made"]
    assert _origin(tmp_path, code, 10)["made"]
    found = _origin(tmp_path, code, 9)
    assert not found["made"] and (found["line"], found["text"]) == (6, "target = y.long()")
    found = _origin(tmp_path, code, 11)
    assert not found["made"] and (found["line"], found["text"]) == (11, "y")
    assert _origin(tmp_path, code, 3) is None  # no call given a target


def test_targets_made_by_a_tuple_assignment_are_the_scripts(tmp_path):
    code = ("import torch\n"
            "real_t, fake_t = torch.ones(4, 1), torch.zeros(4, 1)\n"
            "rows, labels = torch.randn(4, 3), data_labels\n"
            "loss = F.mse_loss(d_out, real_t)\n"
            "loss = F.mse_loss(d_out, labels)\n")
    assert _origin(tmp_path, code, 4)["made"]
    assert not _origin(tmp_path, code, 5)["made"]


def test_targets_returned_by_a_function_of_the_script_that_makes_them(tmp_path):
    code = textwrap.dedent("""\
    import torch
    class MoCo(nn.Module):
        def forward(self, q, k):
            logits = torch.cat([q, k], 1)
            labels = torch.zeros(logits.shape[0], dtype=torch.long)
            return logits, labels
    def read_batch(batch):
        return batch["x"], batch["y"].long()
    model = MoCo()
    other = make_model()
    for x, y in loader:
        output, target = model(x, y)
        a = criterion(output, target)
        inputs, ys = read_batch(x)
        b = criterion(model2(inputs), ys)
        out2, t2 = other(x)
        c = criterion(out2, t2)
        p, t3 = next(iter(loader))
        d = criterion(p, t3)
    """)
    assert _origin(tmp_path, code, 13)["made"]  # MoCo's positives at index 0, from its forward
    assert not _origin(tmp_path, code, 15)["made"]  # a function returning the data's labels
    assert not _origin(tmp_path, code, 17)["made"]  # a model of no class of the file
    assert not _origin(tmp_path, code, 19)["made"]  # a builtin's result


def _run_with(targets, kwargs):
    rec = _Rec()
    watcher = ConstantTargetsWatcher(rec, _Loaders(None))
    for target in targets:
        watcher.loss_call("cross_entropy", PRED, target, (PRED, target), kwargs)
    assert rec.errors == []
    return rec.events


def _masked(value, keep=0.25, n=64):
    target = torch.full((n,), value, dtype=torch.long)
    return target.masked_fill(torch.rand(n) > keep, -100)


def test_the_targets_trained_on_are_judged_without_the_ignore_index():
    torch.manual_seed(0)
    events = _run_with([_masked(7, n=256) for _ in range(8)], {})
    assert [e[1]["stage"] for e in events] == ["few", "many"]
    assert events[-1][1]["value"] == 7 and events[-1][1]["ignore_index"] == -100
    assert events[-1][1]["samples"] == events[-1][1]["values"] < 8 * 256  # the -100s not counted
    # another ignore_index given: -100 is then a class like any other
    assert _run_with([_masked(7) for _ in range(8)], {"ignore_index": 0}) == []
    ignored_zero = [_masked(7).masked_fill(torch.rand(64) > 0.5, 0) for _ in range(8)]
    assert _run_with(ignored_zero, {"ignore_index": 0}) == []  # 7 and -100 trained on
    varied = [torch.randint(0, 5, (64,)).masked_fill(torch.rand(64) > 0.25, -100) for _ in range(8)]
    assert _run_with(varied, {}) == []
    assert _run_with([torch.full((64,), -100)] * 8, {}) == []  # nothing trained on


def test_a_canvas_of_the_ignore_index_is_not_a_constant_the_script_trains_on(tmp_path):
    from graddoctor.analysis.source import ignore_canvas
    code = """\
    import torch
    def encode(batch):
        labels = torch.full((len(batch), 8), -100)
        return labels
    for batch in data:
        labels = encode(batch)
        loss = F.cross_entropy(model(x).view(-1, 5), labels.view(-1))
        zeros = torch.zeros(8, dtype=torch.long)
        loss = F.cross_entropy(sim, zeros)
    """
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(code))
    assert ignore_canvas(str(path), 7, -100) and not ignore_canvas(str(path), 7, 0)
    assert not ignore_canvas(str(path), 9, -100)


def test_the_loop_line_that_builds_the_target_is_found(tmp_path):
    from graddoctor.analysis.source import target_assignment
    code = """\
    import torch
    for batch in loader:
        labels = batch.masked_fill(~masked, -100)
        loss = F.cross_entropy(logits.view(-1, 5), labels[:, 1:].reshape(-1))
        other = F.cross_entropy(logits, targets_from_outside)
    """
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(code))
    assert target_assignment(str(path), 4) == (3, "labels = batch.masked_fill(~masked, -100)")
    assert target_assignment(str(path), 5) is None


def test_the_padding_mask_that_writes_the_ignore_index_is_found(tmp_path):
    from graddoctor.analysis.promptlines import padding_mask_line

    one = tmp_path / "one.py"
    one.write_text("def collate(rows):\n"
                   "    labels = ids.clone()\n"
                   "    labels[attention_mask == 1] = -100\n"
                   "    return labels\n")
    assert padding_mask_line(str(one), -100) == (3, "labels[attention_mask == 1] = -100")
    two = tmp_path / "two.py"
    two.write_text("labels[attention_mask == 0] = -100\n"
                   "labels[:, :prompt_len] = -100\n")
    assert padding_mask_line(str(two), -100) is None  # two writers: no single line to name
    mlm = tmp_path / "mlm.py"
    mlm.write_text("labels[~masked] = -100\n")
    assert padding_mask_line(str(mlm), -100) is None  # not the padding's mask
