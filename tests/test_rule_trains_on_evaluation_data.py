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
