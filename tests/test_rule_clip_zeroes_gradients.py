"""clip-zeroes-gradients (GD218) on hand-written traces."""

from __future__ import annotations

from graddoctor.findings import Severity
from rule_traces import P, builder, findings, only

SLUG = "clip-zeroes-gradients"


def _run(limit, via="clip_grad_norm_", after_step=False):
    t = builder()
    for _ in range(2):
        t.clear(P, line=10)
        t.backward(fresh=P, line=11)
        if after_step:
            t.step(line=13)
        t.event("clip", 12, via=via, params=P, with_grad=P, untracked=0, limit=limit,
                norm_type=2.0, norm_only=limit == float("inf"), total_norm=None, edited=[])
        if not after_step:
            t.step(line=13)
    return t


def test_max_norm_zero_zeroes_the_gradients_the_step_applies():
    f = only(_run(0.0), SLUG)
    assert f.severity is Severity.ERROR and f.location.line == 12
    assert "becomes zero" in f.message and "zero gradients" in f.message
    assert f.evidence["occurrences"] == 2 and f.related[0].location.line == 13


def test_negative_limits_reverse_or_replace_the_gradients():
    assert "up the loss" in only(_run(-1.0), SLUG).message
    assert "ignores the loss" in only(_run(-0.5, via="clip_grad_value_"), SLUG).message


def test_silent_for_positive_or_infinite_limits_and_for_gradients_already_applied():
    assert findings(_run(1.0), SLUG) == []
    assert findings(_run(float("inf")), SLUG) == []
    assert findings(_run(0.0, after_step=True), SLUG) == []


def _edit(tmp_path, line_text, argument):
    from graddoctor.findings import Finding
    from graddoctor.rules.clip_zeroes_gradients import ClipZeroesGradients
    from graddoctor.rules.source import Source
    from graddoctor.trace import Location

    text = f"for step in range(3):\n    loss.backward()\n    {line_text}\n    optimizer.step()\n"
    src = Source("train.py", str(tmp_path / "train.py"), text)
    finding = Finding(rule=SLUG, code="GD218", severity=Severity.ERROR, message="",
                      location=Location("train.py", 3), evidence={"argument": argument})
    fix = ClipZeroesGradients().autofix(finding, src)
    return None if fix is None else fix.edits[0].text


def test_the_fix_guards_the_clip_with_the_scripts_own_limit(tmp_path):
    assert _edit(tmp_path, "clip_grad_norm_(model.parameters(), args.clip)", "args.clip") == (
        "    if args.clip > 0:\n        clip_grad_norm_(model.parameters(), args.clip)\n")
    # a kept norm would be undefined when the guard skips the call; a literal is the user's call
    assert _edit(tmp_path, "norm = clip_grad_norm_(model.parameters(), args.clip)", "args.clip") is None
    assert _edit(tmp_path, "clip_grad_norm_(model.parameters(), 0.0)", "0.0") is None
