"""Watchers that put their originals back when their windows end, with another watcher's
wrapper stacked over theirs: the upper one must survive the lower one's retirement, and the
function must come back to torch's own once both have retired (no idle wrapper left)."""

import torch

from graddoctor.instrument.aggsum import AggregateSumWatcher
from graddoctor.instrument.patcher import Patcher, put_back
from graddoctor.instrument.recorder import Recorder
from graddoctor.instrument.shiftcancel import ShiftCancelWatcher
from graddoctor.instrument.topics import DESCRIBE_LOSS


def test_upper_wrapper_survives_the_lower_watchers_window():
    original = torch.Tensor.div
    rec = Recorder(step_budget=None)
    lower, upper = ShiftCancelWatcher(rec), AggregateSumWatcher(rec)  # shiftcancel: 3 backwards
    rec.subscribe(DESCRIBE_LOSS, lower.describe_loss)
    rec.subscribe(DESCRIBE_LOSS, upper.describe_loss)
    patcher = Patcher()
    lower.install(patcher)
    upper.install(patcher)
    try:
        upper_div = torch.Tensor.div
        assert upper_div is not original
        for _ in range(3):  # the lower watcher's windows end; the upper's is still open
            lower.describe_loss(())
        assert not lower._open and upper._open
        assert torch.Tensor.div is upper_div  # not dropped under the upper watcher
        a, b = torch.ones(4, 3), torch.full((4, 1), 2.0)
        assert torch.equal(a.div(b), torch.full((4, 3), 0.5))
        upper._close()  # its original is the lower's retired wrapper: torch's own comes back
        assert torch.Tensor.div is original
    finally:
        patcher.undo()
    assert torch.Tensor.div is original


class _Owner:
    pass


def test_put_back_restores_only_its_own_wrapper_and_collapses_the_chain():
    def f():
        return "f"

    def lower():
        return "lower"

    def upper():
        return "upper"

    owner = _Owner()
    owner.g = lower
    owner.g = upper  # stacked over the lower wrapper, which it keeps as its original
    assert put_back(owner, "g", f, lower) is False  # the upper is on top: left in place
    assert owner.g is upper
    assert put_back(owner, "g", lower, upper) is True  # the lower is retired: f comes back
    assert owner.g is f
    owner.h = lower
    assert put_back(owner, "h", f, lower) is True
    assert owner.h is f
