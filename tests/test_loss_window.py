"""The loss-graph watchers' window: the first backwards of a run, and of a later phase."""

from __future__ import annotations

from graddoctor.instrument.losswindow import REOPENS, LossWindow
from graddoctor.instrument.topics import DESCRIBE_LOSS, PARAMS_ADDED


class _Rec:
    def __init__(self):
        self.calls = []

    def subscribe(self, topic, fn):
        self.calls.append(("subscribe", topic, fn))

    def retire(self, topic, fn):
        self.calls.append(("retire", topic, fn))

    def resume(self, topic, fn):
        self.calls.append(("resume", topic, fn))


def _describe(tensors):
    return {}


def test_the_window_closes_after_its_size_and_retires_the_describer_at_its_last_backward():
    rec = _Rec()
    window = LossWindow(rec, 3, _describe)
    assert [window.take() for _ in range(5)] == [True, True, True, False, False]
    assert rec.calls == [("retire", DESCRIBE_LOSS, _describe)]


def test_an_optimizer_built_while_the_window_is_open_changes_nothing():
    rec = _Rec()
    window = LossWindow(rec, 2, _describe)
    window.take()
    window.params_added(1, [10, 11])
    assert [window.take() for _ in range(3)] == [True, False, False]
    assert window.reopened == 0


def test_a_later_phase_reopens_the_window_a_bounded_number_of_times():
    rec = _Rec()
    window = LossWindow(rec, 2)  # a watcher that stays subscribed: nothing retired or resumed
    seen = []
    for phase in range(REOPENS + 2):
        seen.append([window.take() for _ in range(3)])
        window.params_added(phase + 1, [phase])
    assert seen == [[True, True, False]] * (REOPENS + 1) + [[False, False, False]]
    assert rec.calls == []


def test_a_retired_describer_is_resumed_when_the_window_reopens():
    rec = _Rec()
    window = LossWindow(rec, 1, _describe)
    assert window.take() and not window.take()
    window.params_added(2, [5])
    assert rec.calls[-1] == ("resume", DESCRIBE_LOSS, _describe)
    assert window.take()
    assert rec.calls[-1] == ("retire", DESCRIBE_LOSS, _describe)


def test_every_watcher_with_a_loss_window_is_installed_and_subscribed_for_a_later_phase():
    import ast
    import pathlib

    import graddoctor.instrument as instrument
    from graddoctor.instrument import Instrumentation
    from graddoctor.instrument.recorder import Recorder

    # the watcher classes that build a LossWindow, read from the source
    classes = set()
    for path in pathlib.Path(instrument.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            if any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "LossWindow"
                   for n in ast.walk(cls)):
                classes.add(cls.name)
    assert len(classes) >= 10
    rec = Recorder(step_budget=None)
    inst = Instrumentation(rec)
    held = {type(w).__name__: w for w in inst.loss_window_holders()}
    assert set(held) == classes
    subscribed = set(rec.subscribers(PARAMS_ADDED).now)
    assert all(w.loss_window.params_added in subscribed for w in held.values())
def test_a_window_ended_early_is_closed_and_a_later_phase_reopens_it():
    rec = _Rec()
    window = LossWindow(rec, 8, _describe)
    window.take()
    window.end()  # the watcher's own count ran out after one backward of eight
    assert window.closed and not window.take()
    assert rec.calls == [("retire", DESCRIBE_LOSS, _describe)]
    window.end()  # retired once
    assert len(rec.calls) == 1
    window.params_added(2, [5])
    assert rec.calls[-1] == ("resume", DESCRIBE_LOSS, _describe)
    assert [window.take() for _ in range(9)] == [True] * 8 + [False]
