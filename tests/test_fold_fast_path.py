"""The folder's fast paths (instrument/fold.py) decide what the slow ones would: a turn compared
with the turn a period back (``_repeats``) is taken for a repeat only when its ``signature``
equals that turn's, and a fold that goes on with the latest fold's period (``Folder.streak``)
folds where the full period search would. No torch."""

from __future__ import annotations

import random

import pytest

from graddoctor.instrument import fold
from graddoctor.instrument.fold import Folder, _plan, _repeats, signature
from graddoctor.trace import Location, Trace

NAN = float("nan")


def _turn(trace: Trace, i: int = 0, *, clear=None, backward=None, begin=None, step=None,
          loc=None) -> list:
    """One turn of a loop (zero_grad, backward, step), its data overridden by the arguments."""
    loc = loc or {}
    start = len(trace.events)
    trace.add("clear", loc.get("clear", Location("train.py", 8)),
              **{"via": "optimizer.zero_grad", "opt": 0, "set_to_none": True, "params": [0, 1],
                 "caller": None, **(clear or {})})
    trace.add("backward", loc.get("backward", Location("train.py", 10)),
              **{"fresh": [0, 1], "accumulated": [], "scale": 512.0, "loss_scale_factor": 1.0,
                 "batch": [0, 0, i], "history": None, **(backward or {})})
    trace.add("step_begin", loc.get("step", Location("train.py", 11)),
              **{"opt": 0, "norm_pids": [0, 1], "norms": [float(i), 1.0], "nonfinite": [],
                 "lrs": [0.1], **(begin or {})})
    trace.add("step", loc.get("step", Location("train.py", 11)), **{"opt": 0, **(step or {})})
    return trace.events[start:]


def _same_shape(a: list, b: list) -> bool:
    def shape(turn):
        made = signature(turn)
        try:
            hash(made)
        except TypeError:
            made = signature(turn, deep=True)
        return made

    return shape(a) == shape(b)


REPEATS = {  # the turn differs from the first one only where the signature leaves it out
    "norms and lrs": dict(begin={"norms": [5.0, NAN], "lrs": [0.05]}),
    "the next batch": dict(backward={"batch": [0, 0, 1]}),
    "another epoch, the same place in it": dict(backward={"batch": [0, 3, 0]}),
    "another loss scale": dict(backward={"scale": 1024.0}),
    "equal locations, other objects": dict(loc={"clear": Location("train.py", 8)}),
    "an int for a float": dict(backward={"loss_scale_factor": 1}),
}
DIFFERS = {  # ... and where it keeps it: never a repeat
    "a nonfinite gradient": dict(begin={"nonfinite": [1]}),
    "another zero_grad line": dict(loc={"clear": Location("train.py", 9)}),
    "another loader": dict(backward={"batch": [1, 0, 1]}),
    "no loss scale": dict(backward={"scale": None}),
    "a NaN factor": dict(backward={"loss_scale_factor": NAN}),
    "a list for a None": dict(backward={"history": [[1, 2]]}),
    "more parameters": dict(clear={"params": [0, 1, 2]}),
    "a key more": dict(step={"skipped": False}),
    "a string for a list": dict(clear={"params": "0,1"}),
    "a dict": dict(clear={"caller": {"path": "a.py", "line": 3}}),
}


@pytest.mark.parametrize("change", [*REPEATS, *DIFFERS])
def test_a_turn_repeats_exactly_when_its_signature_is_the_same(change):
    trace = Trace()
    first = _turn(trace, 0)
    second = _turn(trace, 1, **{**REPEATS, **DIFFERS}[change])
    plan = _plan(first)
    assert plan is not None
    assert _repeats(second, plan) is _same_shape(first, second) is (change in REPEATS)


def test_values_compared_as_the_signature_has_them():
    """A dict is compared in its order, a NaN equals a NaN, a batch relative to the turn's
    first one; the data's keys in another order are never a repeat (a signature differs)."""
    trace = Trace()
    odd = {"caller": {"path": "a.py", "line": 3}, "loss_scale_factor": NAN}
    first = _turn(trace, 4, clear={"caller": odd["caller"]}, backward={"loss_scale_factor": NAN})
    plan = _plan(first)
    same = _turn(trace, 9, clear={"caller": {"path": "a.py", "line": 3}}, backward={"loss_scale_factor": NAN})
    swapped = _turn(trace, 9, clear={"caller": {"line": 3, "path": "a.py"}}, backward={"loss_scale_factor": NAN})
    assert _repeats(same, plan) and _same_shape(first, same)
    assert not _repeats(swapped, plan) and not _same_shape(first, swapped)
    reordered = trace.events[-4:]
    data = dict(reordered[1].data)
    trace.add("backward", reordered[1].loc, **dict(reversed(list(data.items()))))
    turn = [*reordered[:1], trace.events[-1], *reordered[2:]]
    assert not _repeats(turn, plan) and not _same_shape(first, turn)


def test_batches_are_compared_relative_to_the_turns_first():
    """Two backwards of a turn on the same batch are not two on consecutive ones."""
    def two(trace, i, second):
        turn = _turn(trace, i)
        trace.add("backward", turn[1].loc, **{**turn[1].data, "batch": [0, 0, second]})
        return [*turn, trace.events[-1]]

    trace = Trace()
    plan = _plan(two(trace, 0, 0))
    assert _repeats(two(trace, 5, 5), plan) and not _repeats(two(trace, 5, 6), plan)
    assert not _repeats(two(trace, 5, 4), plan)


def test_nested_lists_are_compared_as_the_deep_signature_has_them():
    """A frozen parameter's ``[pid, moved_by, freeze]``: the signature is made deep, and the
    turn still repeats the one before it (a NaN deep inside is no repeat; a tuple for a list
    is none either, though its signature is the same: the slow path decides that one)."""
    trace = Trace()
    plan = _plan(_turn(trace, begin={"frozen": [[2, 0.0, True]]}))
    assert plan is not None
    assert _repeats(_turn(trace, 1, begin={"frozen": [[2, 0.0, True]]}), plan)
    for other in ([[2, 0.5, True]], [[2, 0.0, True], [3, 0.0, True]], [[2, NAN, True]], [2, 0.0, True]):
        turn = _turn(trace, 1, begin={"frozen": other})
        assert not _repeats(turn, plan) and not _same_shape(turn, trace.events[:4])
    turn = _turn(trace, 1, begin={"frozen": [(2, 0.0, True)]})
    assert not _repeats(turn, plan) and _same_shape(turn, trace.events[:4])


def test_a_turn_whose_values_are_not_plain_gets_no_fast_path():
    trace = Trace()
    assert _plan(_turn(trace, backward={"history": [{"op": "mul"}]})) is None  # a dict in a list
    assert _plan(_turn(trace, clear={"params": (0, 1)})) is None
    assert _plan(_turn(trace, begin={"nonfinite": [NAN]})) is None
    assert _plan(_turn(trace, begin={"frozen": [[2, NAN, True]]})) is None


# -- the folder with and without its fast paths -------------------------------------------------
class _Slow(Folder):
    """The folder as it decides without a fast path: every turn's signature, every period tried."""

    def _period(self) -> int:
        streak, self.streak = self.streak, 0
        try:
            return super()._period()
        finally:
            self.streak = streak


VARIANTS = [
    {},
    dict(begin={"nonfinite": [0]}),
    dict(loc={"clear": Location("train.py", 9)}),
    dict(backward={"scale": None}),
    dict(clear={"caller": {"path": "a.py", "line": 3}}),
    dict(clear={"caller": {"line": 3, "path": "a.py"}}),
    dict(backward={"history": [[1, 2]]}),
    dict(begin={"frozen": [[1, 0.0, True]]}),
    dict(begin={"frozen": [(1, 0.0, True)]}),
    dict(backward={"history": [{"op": "mul"}]}),
    dict(backward={"loss_scale_factor": NAN}),
    dict(step={"skipped": True}),
]


def _script(rng: random.Random, turns: int) -> list[tuple[int, int]]:
    """(variant, batch index) per turn: runs of a short repeated pattern of variants, broken now
    and then by another variant or a new pattern, across epochs of batches."""
    out, pattern, epoch_len = [], [0], rng.choice([5, 7, 50])
    for i in range(turns):
        if rng.random() < 0.04:
            pattern = [rng.randrange(len(VARIANTS)) for _ in range(rng.choice([1, 1, 2, 3]))]
        variant = pattern[i % len(pattern)]
        if rng.random() < 0.03:
            variant = rng.randrange(len(VARIANTS))
        out.append((variant, i % epoch_len))
    return out


def _folded(folder_type, script, **sizes) -> list:
    trace = Trace()
    folder = folder_type(trace, fold_after=0, **sizes)
    recorded = Trace()
    for variant, index in script:
        for e in _turn(recorded, index, **VARIANTS[variant]):
            folder.observe(e.kind, e.loc)
            trace.put((e.kind, dict(e.data)), e.loc)
    folder.finish()
    assert [e.seq for e in trace.events if e.kind != "folded"] == sorted(
        e.seq for e in trace.events if e.kind != "folded")
    return [(e.seq, e.kind, dict(e.data) if e.kind == "folded" else None) for e in trace.events]


@pytest.mark.parametrize("seed", range(6))
def test_the_fast_paths_fold_what_the_slow_ones_fold(seed, monkeypatch):
    rng = random.Random(seed)
    script = _script(rng, 700)
    sizes = dict(keep=rng.choice([1, 2]), context=rng.choice([0, 1, 2]), max_period=rng.choice([3, 5, 40]))
    fast = _folded(Folder, script, **sizes)
    assert any(kind == "folded" for _, kind, _ in fast)
    monkeypatch.setattr(fold, "_plan", lambda turn: None)
    assert _folded(_Slow, script, **sizes) == fast


# -- the steady path (Folder.steady_put) -----------------------------------------------------------
def _feed(folder: Folder, trace: Trace, e) -> None:
    """What ``Recorder.emit`` does with an event: the steady path first, else observe and put."""
    made = (e.kind, dict(e.data))
    if folder.steady is not None and folder.steady_put(made, e.loc) is not None:
        return
    folder.observe(e.kind, e.loc)
    trace.put(made, e.loc)


def _view(folder: Folder, trace: Trace) -> list:
    """The trace as a snapshot shows it: the fold in progress at its place."""
    events = list(trace.events)
    marker = folder.marker()
    if marker is not None:
        events.insert(*marker)
    return [(e.seq, e.kind, e.loc, dict(e.data)) for e in events]


def _steady_script(rng: random.Random, turns: int) -> list[tuple[int, int]]:
    """Long runs of one repeated turn (the steady state), broken at random turns by another
    variant, a short pattern, or the same turn at a new location."""
    out, epoch_len, i = [], rng.choice([7, 50, 10 ** 6]), 0
    while len(out) < turns:
        if rng.random() < 0.5:
            out.extend((0, (i + k) % epoch_len) for k in range(rng.randrange(1, 150)))
        else:
            pattern = [rng.randrange(len(VARIANTS)) for _ in range(rng.choice([1, 2, 3]))]
            out.extend((pattern[k % len(pattern)], (i + k) % epoch_len) for k in range(rng.randrange(1, 12)))
        i = len(out)
    return out[:turns]


@pytest.mark.parametrize("seed", range(12))
def test_the_steady_path_leaves_the_trace_as_recording_every_turn_does(seed):
    """A long loop whose turn repeats, deviating at random turns (and looked at by a snapshot at
    random events): every view of the trace and the final trace are those of the folder without
    the steady path."""
    rng = random.Random(seed)
    script = _steady_script(rng, 900)
    sizes = dict(keep=rng.choice([1, 2]), context=rng.choice([0, 1, 2, 3]), max_period=rng.choice([3, 40]))
    fold_after = rng.choice([0, 5])
    plain = Folder(Trace(), fold_after=fold_after, steady_after=10 ** 9, **sizes)
    steady = Folder(Trace(), fold_after=fold_after, steady_after=rng.choice([1, 2, 5]), **sizes)
    recorded = Trace()
    entered = 0
    for variant, index in script:
        for e in _turn(recorded, index, **VARIANTS[variant]):
            _feed(plain, plain.trace, e)
            _feed(steady, steady.trace, e)
            entered += steady.steady is not None and steady.steady.entered
            assert steady.trace.next_seq == plain.trace.next_seq
            if rng.random() < 0.01:  # a snapshot (Recorder.snapshot) ends the steady state
                steady.materialize()
                assert _view(steady, steady.trace) == _view(plain, plain.trace)
    assert entered > 50  # the steady path took events
    for folder in (plain, steady):
        folder.finish()
    assert _view(steady, steady.trace) == _view(plain, plain.trace)
    assert steady.folded_turns == plain.folded_turns


def test_the_steady_path_records_a_deviating_turn_in_full():
    """A turn whose events come in the expected order but whose data differ (a non-finite
    gradient) ends the steady state when it closes, before the next event is recorded: it is
    judged by ``_close_turn`` and kept whole, as without the steady path."""
    folders = [Folder(Trace(), fold_after=0, steady_after=after, max_period=3)
               for after in (3, 10 ** 9)]
    recorded = Trace()
    for i in range(44):
        turn = _turn(recorded, i, **(dict(begin={"nonfinite": [1]}) if i == 40 else {}))
        for folder in folders:
            for e in turn:
                _feed(folder, folder.trace, e)
        if i == 39:
            assert folders[0].steady is not None and folders[0].steady.entered
    for folder in folders:
        folder.finish()
    steady, plain = folders
    assert _view(steady, steady.trace) == _view(plain, plain.trace)
    kept = [e for e in steady.trace.events if e.kind == "step_begin" and e.data["nonfinite"]]
    assert len(kept) == 1 and kept[0].data["norms"] == [40.0, 1.0]


def test_a_failure_while_leaving_the_steady_state_loses_no_event(monkeypatch):
    """The recorder stops folding on the folder's error; the events kept aside are in the
    trace, each once, in seq order."""
    folder = Folder(Trace(), fold_after=0, steady_after=2, max_period=3)
    recorded = Trace()
    for i in range(30):
        for e in _turn(recorded, i):
            _feed(folder, folder.trace, e)
    assert folder.steady is not None and folder.steady.entered
    for e in _turn(recorded, 30)[:2]:  # a turn open on the steady path
        _feed(folder, folder.trace, e)
    aside = [e.seq for turn in (*folder.steady.kept, folder.steady.open) for e in turn]

    def fails(kind, loc):
        raise RuntimeError("observe")

    monkeypatch.setattr(folder, "observe", fails)
    with pytest.raises(RuntimeError):
        folder.materialize()
    seqs = [e.seq for e in folder.trace.events]
    assert set(aside) <= set(seqs) and len(seqs) == len(set(seqs)) and seqs == sorted(seqs)


def test_the_shapes_remembered_hold_a_bounded_number_of_values(monkeypatch):
    """A routed loop (a mixture of experts) makes a new shape every turn, each holding the pids
    its routing chose: past the first ``MIN_SHAPES``, the shapes remembered hold at most
    ``MAX_SHAPE_VALUES`` values, the turns past it get shapes not remembered (never folded, as
    such turns never are: none recurs), and a turn that repeats still folds once the budget is
    spent."""
    monkeypatch.setattr(fold, "MAX_SHAPE_VALUES", 2000)
    monkeypatch.setattr(fold, "MIN_SHAPES", 4)
    folder = Folder(Trace(), fold_after=0, keep=1, context=1, max_period=3)
    recorded = Trace()
    rng = random.Random(0)
    for i in range(60):  # routed: 100 of 400 pids each turn
        fresh = sorted(rng.sample(range(400), 100))
        for e in _turn(recorded, i, backward={"fresh": fresh}):
            _feed(folder, folder.trace, e)
    assert 0 < folder.shape_values <= 2000 and 4 <= len(folder.ids) < 20
    assert folder.unique < -30  # the turns past the budget: shapes not remembered
    before = folder.folded_turns
    for i in range(60, 90):  # then the same small turn again and again
        for e in _turn(recorded, i):
            _feed(folder, folder.trace, e)
    folder.finish()
    assert folder.folded_turns > before + 20
