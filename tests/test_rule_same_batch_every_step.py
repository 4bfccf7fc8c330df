"""same-batch-every-step (GD233): hand-written traces over a small script on disk (the rule
reads which names the fetched batch binds and whether the loop uses them)."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "same-batch-every-step"

SCRIPT = """\
import torch
loader = make()
x, y = next(iter(loader))
for epoch in range(2):
    for step in range({bound}):
        loss = f(model({arg}), y)
        loss.backward()
        opt.step()
"""


def script(tmp_path, bound="len(loader)", arg="x"):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT.format(bound=bound, arg=arg))
    return TraceBuilder(str(path))


def fetched_once(t, updates=4, shuffle=True):
    t.optimizer(0, [0], line=1)
    t.put(ev.loader_sampler(loader=0, sampler="RandomSampler", shuffle=shuffle, dataset_len=64,
                            reach=64), 3)
    t.put(ev.epoch_start(loader=0, epoch=0, real_len=4, replay_len=4), 3)
    for _ in range(updates):
        t.backward(fresh=[0], line=7, batch=[0, 0, 0])
        t.step(0, line=8)


def test_a_batch_fetched_once_while_the_loop_counts_the_loader_is_a_warning(tmp_path):
    t = script(tmp_path)
    fetched_once(t)
    f = only(t, SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 3 and "x, y" in f.message


def test_a_batch_fetched_once_in_a_plain_loop_is_info_and_says_overfit(tmp_path):
    t = script(tmp_path, bound="100")
    fetched_once(t)
    f = only(t, SLUG)
    assert f.severity == Severity.INFO and "overfit-one-batch" in f.message


def test_a_peek_whose_names_the_loop_does_not_use_is_silent(tmp_path):
    t = script(tmp_path, arg="X_all")
    SCRIPT_NO_Y = (tmp_path / "train.py").read_text().replace("f(model(X_all), y)", "f(model(X_all), Y_all)")
    (tmp_path / "train.py").write_text(SCRIPT_NO_Y)
    fetched_once(t)
    assert findings(t, SLUG) == []


def new_iterator_each_update(sampler: str, shuffle: bool, batches: int) -> TraceBuilder:
    """``next(iter(loader))`` before each update: every update begins an epoch of the loader."""
    t = TraceBuilder()
    t.optimizer(0, [0], line=1)
    t.put(ev.loader_sampler(loader=0, sampler=sampler, shuffle=shuffle, dataset_len=64,
                            reach=64), 5)
    for epoch in range(4):
        t.put(ev.epoch_start(loader=0, epoch=epoch, real_len=batches, replay_len=batches), 5)
        t.backward(fresh=[0], line=7, batch=[0, epoch, 0])
        t.step(0, line=8)
    return t


def test_a_new_iterator_each_update_over_an_unshuffled_loader_is_a_warning():
    t = new_iterator_each_update("SequentialSampler", shuffle=False, batches=4)
    f = only(t, SLUG)
    assert f.location.line == 5 and "batch 0" in f.message


def test_a_new_iterator_each_update_over_a_shuffled_loader_is_silent():
    t = new_iterator_each_update("RandomSampler", shuffle=True, batches=4)
    assert findings(t, SLUG) == []


def test_a_loop_over_the_loader_is_silent():
    t = TraceBuilder()
    t.optimizer(0, [0], line=1)
    t.put(ev.epoch_start(loader=0, epoch=0, real_len=4, replay_len=4), 5)
    for i in range(4):
        t.backward(fresh=[0], line=7, batch=[0, 0, i])
        t.step(0, line=8)
    assert findings(t, SLUG) == []


def test_a_loader_of_one_batch_is_full_batch_training_and_silent():
    t = new_iterator_each_update("SequentialSampler", shuffle=False, batches=1)
    assert findings(t, SLUG) == []
