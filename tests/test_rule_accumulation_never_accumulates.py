"""accumulation-never-accumulates (GD209) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.findings import Severity
from rule_traces import P, builder, findings, only, plain_update


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


def test_a_loss_divided_by_the_world_size_of_a_hand_written_all_reduce_is_silent():
    from graddoctor import events as ev
    from graddoctor.rules.accumulation_never_accumulates import AccumulationNeverAccumulates
    from graddoctor.analysis import Analysis
    from graddoctor.trace import TraceBuilder

    def trace(world):
        t = TraceBuilder()
        t.optimizer(0, [0, 1], line=3)
        for _ in range(4):
            t.clear([0, 1], line=5)
            t.backward(fresh=[0, 1], line=6, loss_scale_factor=0.5, loss_terms=["mean"])
            t.put(ev.grad_allreduce(opt=0, op="SUM", world=world, params=2, via="grad",
                                    scale=0.5, before=False), 7)
            t.step(0, line=8)
        return list(AccumulationNeverAccumulates().check(Analysis(t.trace)))

    assert trace(2) == []
    assert len(trace(4)) == 1  # / 2 with four ranks: not the world size


def _accelerate_updates(step_via: str, n=4):
    t = builder()
    for _ in range(n):
        t.via = step_via
        t.clear(P, opt=0, line=10)
        t.via = "accelerate"  # accelerator.backward divided the loss by its accumulation steps
        t.backward(fresh=P, line=11, loss_scale_factor=0.25, loss_terms=["mean"])
        t.via = step_via
        t.step(0, line=12)
    return t


def test_accelerate_dividing_for_an_optimizer_never_prepared_is_a_warning_with_that_fix():
    f = only(_accelerate_updates(""), "accumulation-never-accumulates")
    assert f.severity is Severity.WARNING and f.evidence["cause"] == "optimizer_not_prepared"
    assert "accelerator.prepare()" in f.message and "loss weight" not in f.message
    assert "accelerator.prepare(model, optimizer, loader)" in f.fix and "micro += 1" not in f.fix
    assert f.location.line == 12  # no source to find the prepare call: the step


def test_accelerate_stepping_its_own_wrapper_every_micro_batch_keeps_the_plain_message():
    # the steps went through AcceleratedOptimizer (accelerate frames): not this cause
    f = only(_accelerate_updates("accelerate"), "accumulation-never-accumulates")
    assert f.severity is Severity.INFO and "cause" not in f.evidence


def _accelerate_run(tmp_path, script: str):
    """accelerate's backward (line 11, via accelerate) with the loss divided by 4, then the
    prepared optimizer's step (line 12) after every micro-batch."""
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule

    (tmp_path / "train.py").write_text(script)
    t = builder()
    t.via = "accelerate"
    for _ in range(4):
        plain_update(t, factor=0.25)
    t.via = ""
    return list(find_rule("accumulation-never-accumulates")().check(Analysis(t.trace, base_dir=str(tmp_path))))


OUTSIDE = ("accelerator = Accelerator(gradient_accumulation_steps=4)\n" + "\n" * 8 +
           "for x, y in loader:\n"                        # 10
           "    accelerator.backward(loss_fn(model(x), y))\n"  # 11
           "    optimizer.step()\n")                      # 12


def test_accelerate_dividing_outside_accumulate_is_a_warning_with_the_accumulate_fix(tmp_path):
    (f,) = _accelerate_run(tmp_path, OUTSIDE)
    assert f.severity is Severity.WARNING and f.evidence["cause"] == "outside_accumulate"
    assert "accelerator.accumulate(model)" in f.fix and "counter" not in f.fix


def test_accelerate_without_the_accumulation_setting_keeps_the_info(tmp_path):
    """Accelerator() without gradient_accumulation_steps (or with another count): the 1/4 is
    the script's own, as in a hand-written loop."""
    for script in (OUTSIDE.replace("gradient_accumulation_steps=4", ""),
                   OUTSIDE.replace("gradient_accumulation_steps=4", "gradient_accumulation_steps=2")):
        (f,) = _accelerate_run(tmp_path, script)
        assert f.severity is Severity.INFO and "cause" not in f.evidence


def test_a_loss_module_returning_its_halved_total_with_logged_terms_reads_as_a_weight():
    import ast

    from graddoctor.rules.accumulation_never_accumulates import _literal_weighted, _unpacked

    unpack = ast.parse("loss, det, ident = criterion(a, b)").body[0]
    halved = ast.parse("return 0.5 * total, det, ident").body[0].value
    assert _literal_weighted(_unpacked(unpack, halved, "    loss.backward()\n"), 0.5)
    # the name backpropagated is the second element: its value is no weighted expression
    second = _unpacked(unpack, halved, "det.backward()")
    assert not _literal_weighted(second, 0.5)
    divided = ast.parse("return total / self.accum_steps, det, ident").body[0].value
    assert not _literal_weighted(_unpacked(unpack, divided, "loss.backward()"), 0.5)
    assert _unpacked(unpack, ast.parse("return 0.5 * total, det").body[0].value,
                     "loss.backward()") is None  # lengths differ: nothing is claimed
    plain = ast.parse("loss = criterion(a, b)").body[0]
    assert _unpacked(plain, halved, "loss.backward()") is halved
