"""accumulation-window-misaligned (GD350) on hand-written traces over a small script on disk:
a step on `i % k == 0` (true at the first micro-batch), per epoch or on a global counter, and
the look-alikes that step after k micro-batches from the start."""

from __future__ import annotations

import ast

from graddoctor.findings import Severity
from graddoctor.rules.accumulation_window_misaligned import step_condition
from graddoctor.trace import TraceBuilder
from rule_traces import P, epoch, findings, only

SLUG = "accumulation-window-misaligned"


def _script(tmp_path, test):
    """A file whose line 62 is the step under ``if <test>:`` (line 61)."""
    path = tmp_path / "train.py"
    path.write_text("\n" * 59 + "for i, (x, y) in enumerate(loader):\n"
                    f"    if {test}:\n        optimizer.step()\n        optimizer.zero_grad()\n")
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=1, cls="SGD")
    return t


def _run(t, steps_at, epochs=3, length=9, real_len=9, k=4, global_index=False):
    """Backwards over ``epochs`` x ``length`` batches, a step when ``steps_at(index, k)``; the
    index restarts each epoch unless ``global_index``."""
    fresh, n = True, 0
    for e in range(epochs):
        epoch(t, e, real_len=real_len, replay_len=length, line=60)
        for i in range(length):
            t.backward(fresh=P if fresh else (), accumulated=() if fresh else P, line=61,
                       loss_scale_factor=1 / k, batch=[0, e, i])
            fresh = False
            if steps_at(n if global_index else i, k):
                t.step(line=62)
                t.clear(P, line=63)
                fresh = True
            n += 1
    return t


def test_a_per_epoch_index_with_epochs_k_does_not_divide_is_a_warning_at_the_if(tmp_path):
    t = _run(_script(tmp_path, "i % k == 0"), lambda i, k: i % k == 0, length=10, real_len=10)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 61
    assert f.evidence["k"] == 4 and f.evidence["boundary_window"] == 2
    assert "1 micro-batch left from the previous epoch" in f.message
    assert "`(i + 1) % k == 0`" in f.fix


def test_only_the_first_step_short_is_info(tmp_path):
    # epochs of 12 batches: the tail and the next epoch's first batch make k
    t = _run(_script(tmp_path, "i % k == 0"), lambda i, k: i % k == 0, length=12, real_len=12)
    assert only(t, SLUG).severity is Severity.INFO
    # replayed with 9-batch epochs, the real ones have 32: only the run's first step is short
    t = _run(_script(tmp_path, "not i % k"), lambda i, k: i % k == 0, real_len=32)
    f = only(t, SLUG)
    assert f.severity is Severity.INFO and "multiple of 4" in f.message
    # a global counter from 0: the first window only
    t = _run(_script(tmp_path, "i % k == 0"), lambda i, k: i % k == 0, length=9, global_index=True)
    f = only(t, SLUG)
    assert f.severity is Severity.INFO and not f.evidence["per_epoch"]


def test_windows_of_k_from_the_start_are_silent(tmp_path):
    for test, steps_at in (("(i + 1) % k == 0", lambda i, k: (i + 1) % k == 0),
                           ("i % k == k - 1", lambda i, k: i % k == k - 1)):
        t = _run(_script(tmp_path, test), steps_at)
        assert findings(t, SLUG) == [], test
    # a step after every micro-batch: no accumulation
    t = _run(_script(tmp_path, "i % 1 == 0"), lambda i, k: True)
    assert findings(t, SLUG) == []


def test_step_condition_reads_a_bare_index_modulo_equal_to_zero():
    def cond(test):
        tree = ast.parse(f"for i in r:\n    if {test}:\n        opt.step()\n")
        return step_condition(tree, 3)
    assert cond("i % k == 0") == (2, "i", "k")
    assert cond("0 == self.step % args.accum") == (2, "self.step", "args.accum")
    assert cond("not i % k") == (2, "i", "k")
    assert cond("(i + 1) % k == 0") is None
    assert cond("i % k == 1") is None
    assert cond("i > 0") is None
