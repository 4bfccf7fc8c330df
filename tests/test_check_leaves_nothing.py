"""A finished check leaves nothing of itself alive: the same fixture checked again and again in
one process (a notebook's ``watch()``, a pytest plugin session, this test suite) leaves as many
of graddoctor's wrappers, recorders and the scripts' parameters alive after the last check as
after the first. What a check left behind before (its whole recorder, watchers, wrappers and
the script's model) was held by a weak-keyed table whose values reached its
keys, by tensor and autograd-node hooks in a cycle through torch's C++ graph, and by tables
keyed by the script's classes."""

from __future__ import annotations

import gc
import os
import types

import torch

from conftest import FIXTURES
from fixture_runs import fixture_options
from graddoctor.instrument.recorder import Recorder
from graddoctor.run.session import run_check

# one fixture per way a check stayed alive: every check (the wrappers' table), a gradient hook on
# an RNN's output (the causal-read watcher), a module class of the script's (the parameter walk)
FIXTURES_CHECKED = ("tbptt/good_stream_batchify_lookalikes.py",
                    "modes/bad_functional_dropout_helper_inference.py")
ROUNDS = 2


def _alive() -> dict[str, int]:
    gc.collect()
    counts = {"recorders": 0, "parameters": 0, "wrappers": 0}
    for o in gc.get_objects():
        kind = type(o)
        if kind is Recorder:
            counts["recorders"] += 1
        elif kind is torch.nn.Parameter:
            counts["parameters"] += 1
        elif kind is types.FunctionType and getattr(o, "__wrapped__", None) is not None and \
                (o.__code__.co_filename.startswith("<graddoctor") or
                 (o.__module__ or "").startswith("graddoctor")):
            counts["wrappers"] += 1
    return counts


def test_checks_of_one_script_leave_no_more_alive_than_the_first(monkeypatch):
    def check_all():
        for name in FIXTURES_CHECKED:
            path = os.path.join(FIXTURES, name)
            monkeypatch.chdir(os.path.dirname(path))
            report = run_check(fixture_options(path))
            assert report.run.status in ("completed", "step-limit"), (name, report.run)
            assert not report.internal_errors, report.internal_errors

    # the first round imports, and a module that a check loads (Dynamo, by an optimizer) may keep
    # what it saw of the patched torch: once per process, not per check
    check_all()
    first = _alive()
    for _ in range(ROUNDS):
        check_all()
    assert _alive() == first
