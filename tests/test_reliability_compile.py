"""torch.compile: graddoctor's hooks stay out of compiled graphs (graph breaks), so every step
is seen and the verdict is the eager one; the report says compile was used. The first compile
takes ~20-30 s here: one tiny model, deselect with ``-m "not compile"``."""

from __future__ import annotations

import os
import sys

import pytest

from graddoctor.run.session import run_check
from graddoctor.options import CheckOptions
from reliability_helpers import SCRIPTS, marked_line

pytestmark = pytest.mark.compile

SCRIPT = os.path.join(SCRIPTS, "compiled_step.py")


def test_compiled_training_step_is_seen_and_judged_like_eager():
    import torch

    compile_before = torch.compile
    report = run_check(CheckOptions(target=SCRIPT, steps=0))
    assert (report.run.status, report.run.steps, report.run.backward_calls) == ("completed", 6, 6)
    assert report.internal_errors == []
    assert [(f.rule, f.location.line) for f in report.findings] \
        == [("missing-zero-grad", marked_line(SCRIPT))]
    compiled_at = f"{report.findings[0].location.path}:{marked_line(SCRIPT, '# COMPILE-LINE')}"
    notes = [n for n in report.run.notes if "torch.compile" in n]
    assert len(notes) == 1 and compiled_at in notes[0] and "not seen" in notes[0]
    # graddoctor's folder is off Dynamo's skip list again, torch.compile is torch's own
    assert torch.compile is compile_before
    trace_rules = sys.modules["torch._dynamo.trace_rules"]
    assert not [d for d in trace_rules.SKIP_DIRS if d.rstrip("/").endswith("graddoctor")]


def test_a_compiled_step_checked_again_in_the_same_process_is_judged_the_same():
    """Dynamo compiles a graddoctor wrapper reached from eager code inside a compiled function
    as a frame of its own and caches that on the wrapper's code object: each check's wrappers
    must not share code objects, or the second check runs the first one's cached code (a
    ``NameError`` on its ``__resume_at_...`` function)."""
    first = run_check(CheckOptions(target=SCRIPT, steps=0))
    second = run_check(CheckOptions(target=SCRIPT, steps=0))
    assert first.internal_errors == [] and second.internal_errors == []
    assert [(f.rule, f.location.line) for f in second.findings] \
        == [(f.rule, f.location.line) for f in first.findings]
