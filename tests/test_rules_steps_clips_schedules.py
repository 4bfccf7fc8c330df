"""Rules over steps, clips and schedules on hand-written traces (no torch): double-step (GD108), clip-clips-nothing
(GD208), accumulation-never-accumulates (GD209), plateau-every-batch (GD210). Each is found at
the right line with the right severity, and their correct look-alikes stay silent."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.trace import TraceBuilder

P = [0, 1]


def findings(t: TraceBuilder, slug: str):
    return list(find_rule(slug)().check(Analysis(t.trace)))


def only(t: TraceBuilder, slug: str):
    found = findings(t, slug)
    assert len(found) == 1, found
    return found[0]


def builder(params=P, cls="SGD") -> TraceBuilder:
    t = TraceBuilder()
    t.optimizer(0, params, line=1, cls=cls)
    return t


def plain_update(t, opt=0, params=P, factor=1.0, terms=("mean",), batch=None, line=11, step_line=12):
    t.clear(params, opt=opt, line=10)
    t.backward(fresh=params, line=line, loss_scale_factor=factor,
               loss_terms=list(terms) if terms is not None else None, batch=batch)
    return t.step(opt, line=step_line)


# == double-step ==============================================================================
def test_double_step_points_at_the_second_step_and_names_the_first():
    t = builder()
    for _ in range(3):
        plain_update(t)
        t.step(0, line=13)
    f = only(t, "double-step")
    assert (f.location.line, f.severity) == (13, Severity.ERROR)
    assert [r.location.line for r in f.related] == [12]
    assert f.evidence["occurrences"] == 3 and not f.evidence["via_scaler"]
    assert "line 12" in f.message and "a second time" in f.message


def test_double_step_after_scaler_step_says_so():
    t = builder()
    plain_update(t, step_line=12)
    t.put(ev.scaler_step(scaler=0, opt=0, enabled=True, fused=False, skipped=False,
                         found_inf=False), 12)
    t.step(0, line=13)
    f = only(t, "double-step")
    assert f.evidence["via_scaler"] and "scaler.step(SGD)" in f.message


def test_a_plain_step_after_a_step_the_scaler_skipped_bypasses_the_scaler():
    t = builder()
    plain_update(t)
    t.put(ev.step(opt=0, skipped=True), 12)  # GradScaler found inf/NaN
    t.step(0, line=13)
    f = only(t, "double-step")
    assert f.location.line == 13 and "bypassing the scaler" in f.message
    assert f.evidence["first_skipped"]


def test_a_second_step_the_scaler_skipped_applies_nothing():
    t = builder()
    plain_update(t)
    t.put(ev.step(opt=0, skipped=True), 13)
    assert findings(t, "double-step") == []


def test_double_step_silent_when_anything_touches_the_gradients_between():
    for between in ("backward", "partial_backward", "clear", "module_clear", "grad_edit"):
        t = builder()
        plain_update(t)
        if between == "backward":
            t.backward(accumulated=P, line=14)
        elif between == "partial_backward":
            t.backward(accumulated=[1], line=14)
        elif between == "clear":
            t.clear(P, opt=0, line=14)
        elif between == "module_clear":
            t.clear([0], opt=None, line=14)
        else:
            t.put(ev.grad_edit(opt=0, params=P), 14)
        t.step(0, line=15)
        assert findings(t, "double-step") == [], between


def test_double_step_silent_on_closure_steps_and_disjoint_optimizers():
    t = builder()
    for _ in range(3):  # L-BFGS: every step re-evaluates inside its closure
        t.put(ev.step_begin(opt=0, closure=True, norm_pids=[], norms=[]), 5)
        t.backward(fresh=P, line=6, in_step=0)
        t.step(0, line=5, closure=True)
        t.step(0, line=5, closure=True)
    assert findings(t, "double-step") == []
    t = TraceBuilder()
    t.optimizer(0, [0], line=1)
    t.optimizer(1, [1], line=2)
    for _ in range(3):  # a GAN-like pair, or two scaler.step calls sharing one GradScaler
        t.backward(fresh=P, line=10)
        t.step(0, line=11)
        t.step(1, line=12)
        t.clear([0], opt=0)
        t.clear([1], opt=1)
    assert findings(t, "double-step") == []


def test_double_step_needs_gradients_in_the_second_step():
    t = builder()
    t.step(0, line=3, without_grad=P)  # stepped before the loop: nothing to apply
    t.step(0, line=4, without_grad=P)
    assert findings(t, "double-step") == []


def test_double_step_still_found_when_a_backward_only_writes_another_optimizer():
    t = TraceBuilder()
    t.optimizer(0, [0], line=1)
    t.optimizer(1, [1], line=2)
    t.backward(fresh=P, line=10)
    t.step(0, line=11)
    t.backward(fresh=[1], line=12)  # another model's loss
    t.step(0, line=13)
    assert only(t, "double-step").location.line == 13


def test_optimizer_never_steps_is_silent_on_an_inner_optimizer_a_wrapper_steps():
    t = TraceBuilder()
    t.optimizer(0, P, line=1, cls="SGD")        # the inner optimizer
    t.optimizer(1, P, line=1, cls="Lookahead")  # the wrapper over the same parameters
    for _ in range(3):
        plain_update(t, opt=1)
    t.put(ev.run_end(status="completed", steps=3))
    assert findings(t, "optimizer-never-steps") == []
    t = TraceBuilder()  # a second optimizer whose parameters nothing steps is still found
    t.optimizer(0, P, line=1)
    t.optimizer(1, [0], line=2)
    for _ in range(3):
        t.backward(fresh=P, line=11)
        t.step(1, line=12)
    t.put(ev.run_end(status="completed", steps=3))
    assert only(t, "optimizer-never-steps").location.line == 1


# == clip-clips-nothing =======================================================================
def clip(t, params=(), spent=True, line=20, norm_only=False, untracked=0, **kw):
    return t.put(ev.clip(via="clip_grad_norm_", params=list(params), with_grad=list(params),
                         untracked=untracked, limit="inf" if norm_only else 1.0, norm_type=2.0,
                         norm_only=norm_only, total_norm=None, edited=[], spent=spent, **kw), line)


def test_clip_of_a_used_up_generator_is_an_error_at_the_clip():
    t = builder()
    for _ in range(3):
        t.clear(P, line=10)
        t.backward(fresh=P, line=11)
        clip(t, line=20)
        t.step(0, line=21)
    f = only(t, "clip-clips-nothing")
    assert (f.location.line, f.severity) == (20, Severity.ERROR)
    assert [r.location.line for r in f.related] == [21, 1]
    assert f.evidence["occurrences"] == 3 and f.evidence["spent"] is True


def test_clip_of_an_iterator_it_cannot_look_into_is_a_warning():
    t = builder()
    t.backward(fresh=P, line=11)
    clip(t, spent=None)
    t.step(0, line=21)
    f = only(t, "clip-clips-nothing")
    assert f.severity is Severity.WARNING and "yields nothing" in f.message
    t = builder()  # a trace recorded before `spent` existed reads the same
    t.backward(fresh=P, line=11)
    t.event("clip", 20, via="clip_grad_norm_", params=[], with_grad=[], untracked=0, limit=1.0,
            norm_type=2.0, norm_only=False, total_norm=None, edited=[])
    t.step(0, line=21)
    assert only(t, "clip-clips-nothing").severity is Severity.WARNING


def test_clip_clips_nothing_silent_cases():
    def run(**kw):
        t = builder()
        t.backward(fresh=P, line=11)
        extra = kw.pop("extra", None)
        clip(t, **kw)
        if extra:
            extra(t)
        t.step(0, line=21, without_grad=P if kw.get("line") == 99 else [])
        return findings(t, "clip-clips-nothing")

    assert run(spent=False) == []                # an empty list, a fresh empty generator
    assert run(norm_only=True) == []             # clip_grad_norm_(params, inf): measuring only
    assert run(params=P) == []                   # it received the parameters
    assert run(untracked=2) == []                # it received tensors graddoctor does not track
    assert run(line=99) == []                    # the step applies no gradient
    assert run(extra=lambda t: clip(t, params=P, spent=False, line=22)) == []  # clipped again


def test_clip_clips_nothing_needs_a_step_with_gradients_after_it():
    t = builder()
    t.backward(fresh=P, line=11)
    t.step(0, line=12)
    clip(t)  # the replay ended before another step
    assert findings(t, "clip-clips-nothing") == []
    t = builder()
    t.backward(fresh=P, line=11)
    clip(t)
    t.put(ev.step(opt=0, skipped=True), 21)  # the scaler skipped it: nothing applied
    assert findings(t, "clip-clips-nothing") == []


# == accumulation-never-accumulates ===========================================================
def test_loss_divided_by_k_with_one_backward_per_step_is_info_at_the_backward():
    t = builder()
    for _ in range(4):
        plain_update(t, factor=0.25)
    f = only(t, "accumulation-never-accumulates")
    assert (f.location.line, f.severity) == (11, Severity.INFO)
    assert f.evidence["k"] == 4 and f.evidence["steps"] == 4
    assert "4x smaller learning rate" in f.message and "loss weight" in f.message


def test_adam_like_optimizers_get_the_effective_batch_message():
    t = builder(cls="AdamW")
    for _ in range(3):
        plain_update(t, factor=0.125)
    assert "AdamW largely cancels" in only(t, "accumulation-never-accumulates").message


def test_half_mse_cannot_be_told_apart_and_stays_info():
    # 0.5 * F.mse_loss(...) reads exactly like loss / 2 with a stuck counter: info, never more
    t = builder()
    for _ in range(3):
        plain_update(t, factor=0.5)
    assert only(t, "accumulation-never-accumulates").severity is Severity.INFO


def test_accumulation_never_accumulates_silent_cases():
    def run(factors, terms=("mean",), steps=None, extra=None):
        t = builder()
        for i, factor in enumerate(factors):
            plain_update(t, factor=factor, terms=terms)
            if extra:
                extra(t, i)
        return findings(t, "accumulation-never-accumulates")

    assert run([1.0] * 4) == []                      # no factor at all
    assert run([0.25] * 2) == []                     # too few steps to say "every"
    assert run([0.3] * 4) == []                      # 1 / 0.3 is not a whole number
    assert run([2.0] * 4) == []                      # a multiplication, not a division
    assert run([0.25, 0.25, 0.5]) == []              # the factor changes
    assert run([None] * 4) == []                     # unknown factor (a computed divisor)
    assert run([0.25] * 4, terms=("sum",)) == []     # sum / batch_size, kl_div batchmean: a mean
    assert run([0.5] * 4, terms=("mean", "mean")) == []  # (loss_a + loss_b) / 2: an average
    edit = (lambda t, i: t.put(ev.grad_edit(opt=0, params=P), 12) if i == 1 else None)
    assert run([0.25] * 4, extra=edit) == []         # grads rescaled by hand somewhere


def test_a_window_that_accumulates_silences_it():
    t = builder()
    for _ in range(3):
        plain_update(t, factor=0.25)
    t.clear(P, line=10)
    t.backward(fresh=P, line=11, loss_scale_factor=0.25)
    t.backward(accumulated=P, line=11, loss_scale_factor=0.25)
    t.step(0, line=12)
    assert findings(t, "accumulation-never-accumulates") == []
    t = builder()  # two losses backward'ed at two lines per step: not one backward per step
    for _ in range(3):
        t.clear(P, line=10)
        t.backward(fresh=P, line=11, loss_scale_factor=0.5)
        t.backward(accumulated=P, line=13, loss_scale_factor=0.5)
        t.step(0, line=12)
    assert findings(t, "accumulation-never-accumulates") == []


# == plateau-every-batch ======================================================================
def sched(t, line=30, cls="ReduceLROnPlateau", opt=0, sched_id=0):
    return t.put(ev.scheduler_step(sched=sched_id, cls=cls, opt=opt), line)


def epoch(t, number, loader=0):
    return t.put(ev.epoch_start(loader=loader, epoch=number, real_len=17, replay_len=17), 5)


def loader_loop(t, epochs=2, batches=17, every=1, cls="ReduceLROnPlateau", step_every=1):
    for e in range(epochs):
        epoch(t, e)
        for i in range(batches):
            t.backward(fresh=P, line=11, batch=[0, e, i])
            if (i + 1) % step_every == 0:
                t.step(0, line=12)
                t.clear(P, line=13)
            if (i + 1) % every == 0:
                sched(t, cls=cls)


def test_plateau_stepped_every_batch_of_an_epoch_is_a_warning_at_the_call():
    t = builder()
    loader_loop(t)
    f = only(t, "plateau-every-batch")
    assert (f.location.line, f.severity) == (30, Severity.WARNING)
    assert f.evidence["calls"] == 17 and f.evidence["steps"] == 17 and f.evidence["epoch"] == [0, 0]
    assert "epoch 0 of the DataLoader" in f.message


def test_plateau_stepped_every_micro_batch_is_found_too():
    t = builder()
    loader_loop(t, step_every=4)
    f = only(t, "plateau-every-batch")
    assert f.evidence["calls"] == 17 and f.evidence["steps"] == 4


def test_plateau_without_dataloader_is_info():
    t = builder()
    for _ in range(5):
        plain_update(t)
        sched(t)
    f = only(t, "plateau-every-batch")
    assert f.severity is Severity.INFO and "full-batch" in f.message


def test_plateau_silent_cases():
    t = builder()
    loader_loop(t, every=17)                 # once per epoch
    assert findings(t, "plateau-every-batch") == []
    t = builder()
    loader_loop(t, every=4)                  # after each of four validations per epoch
    assert findings(t, "plateau-every-batch") == []
    t = builder()
    loader_loop(t, cls="OneCycleLR")         # a per-batch schedule stepped per batch
    assert findings(t, "plateau-every-batch") == []
    t = builder()
    loader_loop(t, epochs=6, batches=1)      # full-batch through a DataLoader: 1 batch an epoch
    assert findings(t, "plateau-every-batch") == []
    t = builder()
    loader_loop(t, epochs=1, batches=2)      # two calls are not "every batch" yet
    assert findings(t, "plateau-every-batch") == []
    t = builder()
    for _ in range(2):                       # without a DataLoader: too few steps
        plain_update(t)
        sched(t)
    assert findings(t, "plateau-every-batch") == []
    t = builder()
    for e in range(4):                       # without a DataLoader, an inner loop of 3 steps
        for _ in range(3):
            plain_update(t)
        sched(t)
    assert findings(t, "plateau-every-batch") == []


def test_plateau_of_another_optimizer_counts_its_own_steps():
    t = TraceBuilder()
    t.optimizer(0, [0], line=1)
    t.optimizer(1, [1], line=2)
    for e in range(2):
        epoch(t, e)
        for i in range(17):
            t.backward(fresh=P, line=11, batch=[0, e, i])
            t.step(0, line=12)
            if (i + 1) % 17 == 0:
                t.step(1, line=14)
            sched(t, opt=1)  # drives optimizer 1, which steps once per epoch
    f = only(t, "plateau-every-batch")
    assert f.evidence["steps"] == 1 and f.evidence["optimizer"] == 1


def test_one_root_cause_one_finding_misplaced_clear_is_not_also_never_accumulates():
    """zero_grad before every micro-batch leaves one backward per step: that is misplaced-zero-grad's
    finding, not a counter that never advances."""
    t = builder()
    for i in range(12):
        t.clear(P, opt=0, line=13)
        t.backward(fresh=P, line=15, loss_scale_factor=0.25, loss_terms=["mean"])
        if (i + 1) % 4 == 0:
            t.step(0, line=17)
    assert findings(t, "accumulation-never-accumulates") == []
    assert [f.location.line for f in findings(t, "misplaced-zero-grad")] == [13]
