"""Watchers that put their originals back when their windows end, with another watcher's
wrapper stacked over theirs: the upper one must survive the lower one's retirement, and the
function must come back to torch's own once both have retired (no idle wrapper left)."""

import torch

from graddoctor.instrument.aggsum import AggregateSumWatcher
from graddoctor.instrument.inlinable import _watching
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
        # not dropped under the upper watcher: its frame (which called the lower wrapper
        # itself) now calls torch's own division, with the upper watcher's test in it
        now = torch.Tensor.div
        assert now is not original
        befores, function = _watching(now)
        assert function is original and befores == _watching(upper_div)[0]
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


def test_a_watched_frame_over_a_retired_wrapper_is_rebuilt_around_the_original():
    """A watcher's ``watched`` wrapper calls the one below it directly (one frame for several
    watchers): when the lower one retires first, the frame is rebuilt to call torch's own
    function, its befores kept, and the upper watcher still puts back what it replaced."""
    from graddoctor.instrument.inlinable import watched, watched_call

    seen = []
    owner = _Owner()

    def f(x):
        return x + 1

    owner.g = f
    lower = watched_call(f, lambda args, kwargs, result: seen.append(("lower", result)))
    owner.g = lower
    upper = watched(lower, lambda args, kwargs: seen.append(("upper", args)))
    owner.g = upper
    assert owner.g(1) == 2 and seen == [("upper", (1,)), ("lower", 2)]
    assert put_back(owner, "g", f, lower) is True  # rerouted: the upper frame calls f now
    seen.clear()
    assert owner.g(1) == 2 and seen == [("upper", (1,))]
    assert put_back(owner, "g", lower, upper) is True  # its stand-in counts as its own
    assert owner.g is f
