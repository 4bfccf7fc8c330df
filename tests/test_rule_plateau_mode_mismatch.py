"""plateau-mode-mismatch (GD225) on hand-written traces: a ReduceLROnPlateau whose mode disagrees
with the metric it is fed, judged by the metric's trajectory and the lr cuts, and its look-alikes."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.rules.plateau_mode_mismatch import metric_direction
from graddoctor.trace import TraceBuilder
from lr_traces import sched_init, update
from rule_traces import P, findings, only

SLUG = "plateau-mode-mismatch"


def run(tmp_path, argument: str, mode: str, values, lrs):
    path = tmp_path / "train.py"
    path.write_text("\n" * 4 + "plateau = ReduceLROnPlateau(optimizer)\n"
                    + "\n" * 14 + f"plateau.step({argument})\n")
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=1)
    sched_init(t, cls="ReduceLROnPlateau", lrs=(0.1,), line=5)
    for value, lr in zip(values, lrs):
        for _ in range(3):
            update(t, lr=lr)
        t.put(ev.scheduler_step(sched=0, cls="ReduceLROnPlateau", opt=0, lrs=[lr], metric="number",
                                value=value, mode=mode), 20)
    return t


def test_accuracy_in_min_mode_cut_while_rising_is_a_warning_at_the_construction(tmp_path):
    t = run(tmp_path, "val_acc", "min", [0.5, 0.6, 0.7], [0.1, 0.05, 0.025])
    f = only(t, SLUG)
    assert (f.location.line, f.severity) == (5, Severity.WARNING)
    assert "0.5 to 0.6" in f.message and 'mode="max"' in f.fix


def test_the_name_alone_is_info(tmp_path):
    t = run(tmp_path, "score", "min", [0.5], [0.1])
    assert only(t, SLUG).severity is Severity.INFO


def test_a_loss_in_max_mode_cut_while_falling_is_a_warning(tmp_path):
    t = run(tmp_path, "val_loss", "max", [1.0, 0.8], [0.1, 0.05])
    assert only(t, SLUG).severity is Severity.WARNING


def test_agreeing_modes_and_unnamed_metrics_are_silent(tmp_path):
    assert findings(run(tmp_path, "val_acc", "max", [0.5, 0.6], [0.1, 0.1]), SLUG) == []
    # an overfitting loss rises and is cut in mode="min": correct
    assert findings(run(tmp_path, "val_loss", "min", [1.0, 1.2, 1.4], [0.1, 0.05, 0.025]), SLUG) == []
    assert findings(run(tmp_path, "m", "min", [0.5, 0.6, 0.7], [0.1, 0.05, 0.025]), SLUG) == []


def test_metric_direction_reads_the_names():
    assert metric_direction("val_acc") == "max" and metric_direction("valAccuracy") == "max"
    assert metric_direction("-val_loss") == "max" and metric_direction("neg_val") == "max"
    assert metric_direction("metrics['loss']") == "min" and metric_direction("x") is None


def test_metric_direction_follows_the_arithmetic_around_the_names():
    # an error rate made from an accuracy is lower-is-better; a reciprocal loss higher
    assert metric_direction("1.0 - accuracy") == "min" and metric_direction("1 - val_acc") == "min"
    assert metric_direction("-val_acc") == "min" and metric_direction("1 / val_loss") == "max"
    assert metric_direction("val_loss / n") == "min" and metric_direction("acc - 0.1 * loss") == "max"
    assert metric_direction("acc + loss") is None  # the operands disagree


def test_a_new_best_counted_as_no_progress_is_a_warning_before_any_cut(tmp_path):
    t = run(tmp_path, "val_loss", "max", [1.0, 0.8], [0.1, 0.1])
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and "1 to 0.8, a new best" in f.message


def test_a_metric_that_only_worsened_is_still_info(tmp_path):
    # the loss rose: in mode="max" those were improvements to the scheduler; nothing cut yet
    assert only(run(tmp_path, "val_loss", "max", [1.0, 1.1], [0.1, 0.1]), SLUG).severity is Severity.INFO
    # a change within noise is no new best
    assert only(run(tmp_path, "val_loss", "max", [1.0, 0.99999], [0.1, 0.1]), SLUG).severity is Severity.INFO


def _run_beside(tmp_path, construction: str, bound: str):
    path = tmp_path / "train.py"
    path.write_text("\n" * 4 + construction + "\n" + "\n" * 12 + bound + "\n\n"
                    + "plateau.step(val_f1)\n")
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=1)
    sched_init(t, cls="ReduceLROnPlateau", lrs=(0.1,), line=5)
    for value, lr in zip([0.5, 0.6, 0.7], [0.1, 0.05, 0.025]):
        for _ in range(3):
            update(t, lr=lr)
        t.put(ev.scheduler_step(sched=0, cls="ReduceLROnPlateau", opt=0, lrs=[lr], metric="number",
                                value=value, mode="min"), 20)
    return t


def test_a_mode_written_out_and_its_metric_bound_beside_point_at_the_step(tmp_path):
    t = _run_beside(tmp_path, 'plateau = ReduceLROnPlateau(optimizer, mode="min")',
                    "val_loss, val_f1 = evaluate()")
    f = only(t, SLUG)
    assert f.location.line == 20 and f.fix == "feed the metric the mode was written for: plateau.step(val_loss)"
    assert [r.location.line for r in f.related] == [5] and "`val_loss`" in f.message


def test_the_default_mode_or_no_metric_beside_keep_the_construction(tmp_path):
    t = _run_beside(tmp_path, "plateau = ReduceLROnPlateau(optimizer)", "val_loss, val_f1 = evaluate()")
    assert only(t, SLUG).location.line == 5  # the mode was never chosen: change it
    t = _run_beside(tmp_path, 'plateau = ReduceLROnPlateau(optimizer, mode="min")', "n, val_f1 = evaluate()")
    assert only(t, SLUG).location.line == 5


def _two_schedulers_one_line(tmp_path, step_line: str):
    """sched_a (mode="max") fed an F1 and sched_b (mode="min") fed a loss, both stepped on
    line 20; each scheduler's step is read at the call on its own name."""
    path = tmp_path / "train.py"
    path.write_text("\n" * 4 + 'sched_a = ReduceLROnPlateau(opt_a, mode="max")\n'
                    + 'sched_b = ReduceLROnPlateau(opt_b, "min")\n' + "\n" * 13 + step_line + "\n")
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=1)
    sched_init(t, cls="ReduceLROnPlateau", sched=0, lrs=(0.1,), line=5)
    sched_init(t, cls="ReduceLROnPlateau", sched=1, lrs=(0.1,), line=6)
    for f1, loss in zip([0.5, 0.6, 0.7], [1.0, 0.8, 0.6]):
        for _ in range(3):
            update(t, lr=0.1)
        t.put(ev.scheduler_step(sched=0, cls="ReduceLROnPlateau", opt=0, lrs=[0.1], metric="number",
                                value=f1, mode="max"), 20)
        t.put(ev.scheduler_step(sched=1, cls="ReduceLROnPlateau", opt=0, lrs=[0.1], metric="number",
                                value=loss, mode="min"), 20)
    return t


def test_each_scheduler_stepped_on_a_shared_line_is_read_at_its_own_call(tmp_path):
    assert findings(_two_schedulers_one_line(tmp_path, "sched_a.step(val_f1); sched_b.step(val_loss)"), SLUG) == []
    # the metrics handed the other way round: both are reported, each at its own construction
    t = _two_schedulers_one_line(tmp_path, "sched_a.step(val_loss); sched_b.step(val_f1)")
    assert sorted(f.location.line for f in findings(t, SLUG)) == [5, 6]
