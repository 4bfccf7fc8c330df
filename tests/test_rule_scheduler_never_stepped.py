"""scheduler-never-stepped (GD220) on hand-written traces."""

from __future__ import annotations

from graddoctor.findings import Severity
from lr_traces import builder, epoch, loader_run, sched_init, sched_step, update
from rule_traces import findings, only

SLUG = "scheduler-never-stepped"


def test_a_warm_up_never_stepped_past_an_epoch_end_is_a_warning_at_its_construction():
    t = builder()
    sched_init(t, args={"start_factor": 0.01, "total_iters": 100}, line=5)
    loader_run(t, lr=0.001)
    f = only(t, SLUG)
    assert (f.location.line, f.severity) == (5, Severity.WARNING)
    assert "1 %" in f.message and "34 steps" in f.message


def test_a_scheduler_that_sets_no_factor_is_info():
    t = builder()
    sched_init(t, cls="CosineAnnealingLR", args={"T_max": 10}, lrs=(0.1,))
    loader_run(t)
    assert only(t, SLUG).severity is Severity.INFO


def test_silent_when_stepped_directly_or_through_its_container():
    t = builder()
    sched_init(t, args={"start_factor": 0.01})
    loader_run(t, per_batch=(0, "LinearLR"))
    assert findings(t, SLUG) == []
    t = builder()
    sched_init(t, sched=0, args={"start_factor": 0.01})
    sched_init(t, sched=1, cls="CosineAnnealingLR", lrs=(0.001,))
    sched_init(t, sched=2, cls="SequentialLR", children=(0, 1), lrs=(0.001,), base=())
    loader_run(t, per_epoch=(2, "SequentialLR"))
    assert findings(t, SLUG) == []


def test_silent_before_any_epoch_end_and_for_plateau():
    t = builder()
    sched_init(t, args={"start_factor": 0.01})
    for _ in range(10):
        update(t, lr=0.001)  # no DataLoader, stopped by the step budget: maybe a per-epoch step
    assert findings(t, SLUG) == []
    t = builder()
    sched_init(t, cls="ReduceLROnPlateau", lrs=(0.1,))
    loader_run(t)
    assert findings(t, SLUG) == []


def _swa_script(tmp_path, steps_swa: bool):
    """Line 5 builds ``swa_scheduler``; the file calls ``swa_scheduler.step()`` (from an epoch on)
    or not at all."""
    from graddoctor.trace import TraceBuilder
    from rule_traces import P
    path = tmp_path / "train.py"
    later = "    if epoch >= swa_start:\n        swa_scheduler.step()\n" if steps_swa else "    pass\n"
    path.write_text("\n" * 4 + "swa_scheduler = SWALR(optimizer, swa_lr=0.05)\n"
                    "for epoch in range(4):\n" + later)
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=1, cls="SGD")
    return t


def test_silent_when_the_script_steps_it_later_than_a_cut_short_replay_went(tmp_path):
    # the SWA recipe: SWALR stepped from swa_start on; the replay stopped at its step budget first
    t = _swa_script(tmp_path, steps_swa=True)
    sched_init(t, cls="SWALR", args={"swa_lr": 0.05}, lrs=(0.1,))
    loader_run(t)
    t.event("run_end", None, status="step-limit", steps=34)
    assert findings(t, SLUG) == []
    # the source never calls its step(): reported, cut short or not
    t = _swa_script(tmp_path, steps_swa=False)
    sched_init(t, cls="SWALR", args={"swa_lr": 0.05}, lrs=(0.1,))
    loader_run(t)
    t.event("run_end", None, status="step-limit", steps=34)
    assert only(t, SLUG).severity is Severity.INFO


def test_another_stepped_scheduler_of_the_optimizer_is_named_not_a_constant_lr():
    t = builder()
    sched_init(t, sched=0, cls="CosineAnnealingLR", args={"T_max": 4}, lrs=(0.1,))
    sched_init(t, sched=1, cls="SWALR", args={"swa_lr": 0.05}, lrs=(0.1,))
    loader_run(t, per_epoch=(0, "CosineAnnealingLR"))
    f = only(t, SLUG)
    assert f.severity is Severity.INFO and "constant" not in f.message
    assert "follows CosineAnnealingLR alone" in f.message
    assert f.evidence["stepped_with"] == ["CosineAnnealingLR"]


def _script(tmp_path, body: str):
    from graddoctor.trace import TraceBuilder
    from rule_traces import P
    path = tmp_path / "train.py"
    path.write_text("\n" * 4 + body)
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=1, cls="SGD")
    return t


def test_a_replay_cut_before_any_epoch_end_is_judged_by_the_source(tmp_path):
    # no DataLoader: the step budget ends the replay; the source never calls warmup.step()
    t = _script(tmp_path, "warmup = LinearLR(optimizer, start_factor=0.01)\nfor i in range(99):\n    pass\n")
    sched_init(t, args={"start_factor": 0.01}, line=5)
    for _ in range(10):
        update(t, lr=0.001)
    t.event("run_end", None, status="step-limit", steps=10)
    f = only(t, SLUG)
    assert (f.location.line, f.severity) == (5, Severity.WARNING)


def test_the_object_is_followed_to_the_name_that_steps_it(tmp_path):
    # SimCLR: built as ``scheduler``, handed to a trainer as a keyword, stepped as
    # self.lr_schedule.step() from epoch 10 on; the replay ends before
    body = ("scheduler = CosineAnnealingLR(optimizer, T_max=10)\n"
            "class Trainer:\n"
            "    def __init__(self, **kw):\n"
            "        self.lr_schedule = kw['sched']\n"
            "    def fit(self):\n"
            "        self.lr_schedule.step()\n"
            "Trainer(sched=scheduler).fit()\n")
    t = _script(tmp_path, body)
    sched_init(t, cls="CosineAnnealingLR", args={"T_max": 10}, lrs=(0.1,), line=5)
    loader_run(t)
    t.event("run_end", None, status="step-limit", steps=34)
    assert findings(t, SLUG) == []
    # the same trainer stepping another object: the cosine schedule is never stepped
    t = _script(tmp_path, body.replace("Trainer(sched=scheduler)", "Trainer(sched=other)"))
    sched_init(t, cls="CosineAnnealingLR", args={"T_max": 10}, lrs=(0.1,), line=5)
    loader_run(t)
    t.event("run_end", None, status="step-limit", steps=34)
    assert only(t, SLUG).severity is Severity.INFO


def test_of_two_assignments_on_its_line_the_one_that_builds_the_scheduler_is_followed(tmp_path):
    # ``swa = AveragedModel(model); swa_sched = SWALR(...)``: the first target is not the scheduler
    body = ("swa = AveragedModel(model); swa_sched = SWALR(optimizer, swa_lr=0.05)\n"
            "for epoch in range(6):\n"
            "    if epoch >= 3:\n"
            "        swa.update_parameters(model); swa_sched.step()\n")
    t = _script(tmp_path, body)
    sched_init(t, cls="SWALR", args={"swa_lr": 0.05}, lrs=(0.1,), line=5)
    loader_run(t)
    t.event("run_end", None, status="step-limit", steps=34)
    assert findings(t, SLUG) == []
    # the line's other object stepped, the scheduler never: reported
    t = _script(tmp_path, body.replace("swa_sched.step()", "swa.step()"))
    sched_init(t, cls="SWALR", args={"swa_lr": 0.05}, lrs=(0.1,), line=5)
    loader_run(t)
    t.event("run_end", None, status="step-limit", steps=34)
    assert only(t, SLUG).severity is Severity.INFO
