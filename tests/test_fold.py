"""Long runs: the recorder folds repeated turns out of the trace (instrument/fold.py) so memory
stays bounded, findings and their counts stay what they were, and provisional ``-o`` reports take
a bounded share of the run's time (run/session.py). tests/test_fixtures.py checks every fixture's
findings on its trace folded as hard as the folder can (``rule_traces.fold_hard``)."""

from __future__ import annotations

import time

import pytest

from graddoctor.run import interim as check_module
from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.run.session import run_check
from graddoctor.instrument import Recorder, fold
from graddoctor.instrument.fold import Folder
from graddoctor.options import CheckOptions
from graddoctor.report.timeline import shapes, step_ranges
from graddoctor.trace import Location
from rule_traces import fold_hard

LOOP = """\
import sys, torch
torch.manual_seed(0)
n, nan_from, nan_to = (int(a) for a in sys.argv[1:4])
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(4, 4), torch.randn(4, 1)
for i in range(n):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    if nan_from <= i < nan_to:
        loss = loss * float("nan")
    loss.backward()
    opt.step()
"""


def _run(tmp_path, monkeypatch, *args, fold_after=None, steps=0, checkpoint=None):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fold, "FOLD_AFTER", 10 ** 9 if fold_after is None else fold_after)
    return run_check(CheckOptions(target="loop.py", args=tuple(map(str, args)), steps=steps),
                     checkpoint=checkpoint)


def _findings(report):
    return [(f.rule, f.severity.value, str(f.location), f.message, f.step,
             [(str(r.location), r.note) for r in f.related]) for f in report.findings]


# -- the trace stays bounded, the report stays true -------------------------------------------
def test_a_long_steady_run_keeps_a_bounded_trace(tmp_path, monkeypatch):
    report = _run(tmp_path, monkeypatch, 900, -1, -1, fold_after=30)
    a = report.analysis
    assert report.run.status == "completed" and report.run.steps == 900
    assert len(a.events) < 250  # recorded whole: 4 events per step, 3600 in all
    [folded] = a.of_kind("folded")
    assert folded["steps"] == folded["turns"] == folded["backwards"] > 700
    assert (a.step_count, a.backward_calls) == (900, 900)
    assert [s.seq for s in a.steps] == sorted(s.seq for s in a.steps)
    assert [a.step_number[s.seq] for s in a.steps][-1] == 900
    [shape] = shapes(a)
    assert (shape.updates, step_ranges(shape.steps)) == (900, "1–900")


@pytest.mark.parametrize("nan", [(600, 601), (500, 900)], ids=["one-step", "from-500-on"])
def test_findings_and_counts_are_those_of_the_whole_trace(tmp_path, monkeypatch, nan):
    """A NaN turn deep in a folded run is kept in full: the finding points at the same line and
    step, and counts the steps affected, folded ones included (the NaN reaches the weights, so
    every later step has NaN gradients too: those turns fold as well). The skim, which may find
    a NaN of a skimmed turn at the next sampled one (tests/test_steady_hooks.py), starts after
    step 600 here."""
    monkeypatch.setattr(fold, "SKIM_AFTER", 400)
    whole = _run(tmp_path, monkeypatch, 900, *nan)
    folded = _run(tmp_path, monkeypatch, 900, *nan, fold_after=30)
    assert folded.analysis.of_kind("folded")
    assert len(folded.analysis.events) < len(whole.analysis.events) / 4
    assert _findings(folded) == _findings(whole)
    [finding] = folded.findings
    assert finding.rule == "nonfinite-grad" and finding.step == nan[0] + 1
    assert f"({900 - nan[0]} steps affected)" in finding.message


def test_a_provisional_report_mid_fold_counts_every_step(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(check_module, "CHECKPOINT_EVERY_S", 0.0)
    # the time allowance for provisional reports is not what this counts: on a loaded box it
    # runs out before the fold begins
    monkeypatch.setattr(check_module, "CHECKPOINT_ALLOWANCE_S", 1e9)
    monkeypatch.setattr(check_module, "CHECKPOINT_CPU_SHARE", 1e9)

    def checkpoint(report):
        seen.append((report.run.steps, report.analysis.step_count,
                     bool(report.analysis.of_kind("folded"))))

    _run(tmp_path, monkeypatch, 400, -1, -1, fold_after=20, checkpoint=checkpoint)
    assert any(has_fold for _, _, has_fold in seen)
    assert all(steps == counted for steps, counted, _ in seen)


# -- the folder on a hand-made loop ------------------------------------------------------------
def _loop(rec: Recorder, turns: int, nan_at=(), line_of_clear=8) -> None:
    loc = lambda line: Location("train.py", line)  # noqa: E731
    for i in range(turns):
        rec.emit(ev.clear(via="optimizer.zero_grad", opt=0, params=[0, 1]), loc(line_of_clear))
        rec.emit(ev.backward(fresh=[0, 1], accumulated=[], cleared_outside=[]), loc(10))
        rec.emit(ev.step_begin(opt=0, norm_pids=[0, 1], norms=[float(i), 1.0],
                               nonfinite=[0] if i in nan_at else []), loc(11))
        rec.emit(ev.step(opt=0), loc(11))


def test_folder_keeps_first_deviating_and_last_turns():
    rec = Recorder(step_budget=None)
    rec.folder = Folder(rec.trace, fold_after=0, keep=2, context=1, max_period=3)
    _loop(rec, 100, nan_at={50})
    rec.finish()
    a = Analysis(rec.trace)
    folds = a.of_kind("folded")
    assert len(folds) == 2  # before and after the NaN turn
    assert a.step_count == 100 and a.backward_calls == 100
    nan_steps = [a.step_number[e.seq] for e in a.events if e.kind == "step"
                 and a.event(e.seq - 1)["nonfinite"]]
    assert nan_steps == [51]  # the deviating turn, numbered as in the run
    assert sum(a.weight(s) for s in a.steps) == 100
    # the last turn is recorded whole (its gradient norms are the last update's)
    last_begin = a.of_kind("step_begin")[-1]
    assert last_begin["norms"][0] == 99.0
    # seqs are the recorded ones: increasing, with gaps where turns were folded
    seqs = [e.seq for e in a.events]
    assert seqs == sorted(seqs) and seqs[-1] == 100 * 4 - 1  # a folded event takes a folded seq


def test_folder_folds_whole_periods_only():
    """Turns that alternate (A B A B ...) fold two at a time: no A is ever shown next to an A."""
    rec = Recorder(step_budget=None)
    rec.folder = Folder(rec.trace, fold_after=0, keep=1, context=1, max_period=4)
    for i in range(60):
        _loop(rec, 1, line_of_clear=8 if i % 2 else 9)
    rec.finish()
    a = Analysis(rec.trace)
    assert a.of_kind("folded") and a.step_count == 60
    clears = [e.loc.line for e in a.events if e.kind == "clear"]
    assert all(x != y for x, y in zip(clears, clears[1:]))
    # the timeline: 30 turns of each shape; the folded ones among the steps the fold covered
    found = shapes(a)
    assert [s.updates for s in found] == [30, 30]
    [fold_event] = a.of_kind("folded")
    first = a.steps_before(fold_event.seq) + 1
    last = first + fold_event["steps"] - 1
    assert f"{fold_event['steps'] // 2} of {first}–{last}" in step_ranges(found[0].steps)


def test_folding_fails_safe(monkeypatch):
    """A failure in the folder keeps every event from then on and becomes an internal error."""
    rec = Recorder(step_budget=None)
    rec.folder = Folder(rec.trace, fold_after=0)
    monkeypatch.setattr(Folder, "observe", lambda *a: 1 / 0)
    _loop(rec, 3)
    rec.finish()
    kinds = [e.kind for e in rec.trace.events]
    assert kinds.count("step") == 3 and kinds.count("internal_error") == 1


def test_the_folded_event_is_what_its_constructor_makes():
    rec = Recorder(step_budget=None)
    rec.folder = Folder(rec.trace, fold_after=0, keep=1, context=1, max_period=1)
    _loop(rec, 10)
    rec.finish()
    [folded] = [e for e in rec.trace.events if e.kind == "folded"]
    assert ev.CONSTRUCTORS["folded"](**folded.data) == ("folded", dict(folded.data))


# -- folding a recorded trace as hard as the folder can (rule_traces.fold_hard) ----------------
def test_fold_hard_folds_a_repeated_turn_and_keeps_its_counts():
    rec = Recorder(step_budget=None)
    rec.folder = None
    _loop(rec, 12, nan_at={6})
    whole = Analysis(rec.trace)
    folded = Analysis(fold_hard(rec.trace))
    assert len(folded.events) < len(whole.events) and folded.of_kind("folded")
    assert (folded.step_count, folded.backward_calls) == (whole.step_count, whole.backward_calls) == (12, 12)
    assert folded.count(folded.of_kind("clear")) == 12
    assert [folded.step_number[s.seq] for s in folded.steps if folded.event(s.seq - 1)["nonfinite"]] == [7]


# -- provisional reports: a bounded share of the time -----------------------------------------
def test_provisional_reports_take_a_bounded_share_of_the_time(tmp_path, monkeypatch):
    """With a step budget a provisional report was due after every step, each one analysing
    the whole trace so far: quadratic. Now they take at most CHECKPOINT_SHARE of the time
    beyond CHECKPOINT_ALLOWANCE_S."""
    monkeypatch.setattr(check_module, "CHECKPOINT_ALLOWANCE_S", 0.0)
    calls = []

    def slow_checkpoint(report):  # a write that costs 20 ms
        calls.append(report.run.steps)
        time.sleep(0.02)

    started = time.perf_counter()
    report = _run(tmp_path, monkeypatch, 300, -1, -1, steps=300, checkpoint=slow_checkpoint)
    took = time.perf_counter() - started
    assert report.run.steps == 300
    # after every step would be 301; how many fit in the share depends on the machine's load
    # (the first one, at the start, is always written)
    assert 1 <= len(calls) < 60
    assert len(calls) * 0.02 <= 0.1 * took + 0.1


def test_a_killed_run_leaves_its_latest_provisional_report(tmp_path):
    """The process dies (SIGKILL, as the OOM killer does) during a folded run: the -o file
    holds the provisional report written after the last step, every step counted (with a
    step budget one is due after every step; without one, every 2 s)."""
    import json

    from conftest import run_cli

    script = tmp_path / "killed.py"
    script.write_text(LOOP.replace("    opt.step()\n", "    opt.step()\n    if i == 41:\n"
                                   "        import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n"))
    # graddoctor's CLI, folding after 10 steps. The writes' share of the time is lifted: on a
    # loaded box (every write descheduled for long) the first allowance ran out before the
    # 42nd step and its report was skipped, a throttle of its own test (above), not this one's
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import sys, runpy\nfrom graddoctor.instrument import fold\nfold.FOLD_AFTER = 10\n"
        "from graddoctor.run import interim\ninterim.CHECKPOINT_ALLOWANCE_S = 1e9\n"
        "sys.argv = ['graddoctor', 'check', 'killed.py', '--steps', '100', '-f', 'json', "
        "'-o', 'out.json', '--', '100', '-1', '-1']\n"
        "runpy.run_module('graddoctor', run_name='__main__')\n")
    from conftest import run_python

    result = run_python("driver.py", cwd=tmp_path)
    assert result.returncode == -9, result.stderr[-2000:]
    run = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))["run"]
    assert run["status"] == "crashed" and run["error"]["type"] == "Unfinished"
    assert run["steps"] == 42


# -- rules count through the analysis ------------------------------------------------------------
def test_by_epoch_counts_folded_copies_in_their_epoch():
    rec = Recorder(step_budget=None)
    rec.folder = None
    for epoch in range(2):
        rec.emit(ev.epoch_start(loader=0, epoch=epoch, real_len=8, replay_len=8), Location("train.py", 5))
        for i in range(8):
            rec.emit(ev.backward(fresh=[0], accumulated=[], cleared_outside=[], batch=[0, epoch, i]),
                     Location("train.py", 10))
            rec.emit(ev.step(opt=0), Location("train.py", 11))
    steps = lambda e: "step" if e.kind == "step" else None  # noqa: E731
    whole = {k: n for k, (_, n) in Analysis(rec.trace).by_epoch(steps).items()}
    folded = Analysis(fold_hard(rec.trace))
    assert folded.of_kind("folded") and whole == {("step", (0, 0)): 8, ("step", (0, 1)): 8}
    assert {k: n for k, (_, n) in folded.by_epoch(steps).items()} == whole


def test_rules_see_folding_only_through_the_analysis():
    """A rule that read the ``folded`` events would count on its own, and could count wrong:
    rules count with Analysis.count / weight / by_epoch and step numbers instead."""
    import pathlib

    import graddoctor.rules as rules

    fold_words = ('"folded"', "'folded'", "copies_in(", "._copies", "folded_steps", "._folded")
    readers = sorted(f"{path.name} ({word})" for path in pathlib.Path(rules.__file__).parent.glob("*.py")
                     for word in fold_words if word in path.read_text(encoding="utf-8"))
    assert not readers, f"rules reading the recorder's folds: {', '.join(readers)}"


def test_the_period_test_compares_what_the_whole_sequence_would():
    """``Folder._period`` looks only at the turns a period needs; on random id sequences it
    answers what the comparison over every decided and undecided turn answered."""
    import random
    from collections import deque

    def reference(recent, pending, keep, context, max_period):
        ids = [*recent, *(t[2] for t in pending)]
        front = len(recent)
        for p in range(1, max_period + 1):
            if len(pending) < p + context or front < keep * p:
                return 0
            if all(ids[j] == ids[j - p] for j in range(front - (keep - 1) * p, front + p + context)):
                return p
        return 0

    rng = random.Random(0)
    folder = Folder(Recorder(step_budget=None).trace, keep=2, context=2, max_period=5)
    for _ in range(3000):
        alphabet = rng.randint(1, 3)
        folder.recent = deque((rng.randrange(alphabet) for _ in range(rng.randint(0, 14))),
                              maxlen=folder.recent.maxlen)
        folder.pending = [[0, 0, rng.randrange(alphabet)] for _ in range(rng.randint(0, 9))]
        folder._failed = 0
        assert folder._period() == reference(folder.recent, folder.pending, 2, 2, 5)
