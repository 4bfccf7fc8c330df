"""misplaced-zero-grad (GD104) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

import textwrap

from graddoctor.options import CheckOptions
from graddoctor.run.session import run_check

from graddoctor import events as ev
from graddoctor.trace import TraceBuilder
from rule_traces import P, builder, epoch, findings, slugs


def test_clear_inside_new_epoch_dropping_the_tail_is_not_misplaced():
    t = builder()
    for e in range(3):
        epoch(t, e)
        for i in range(9):
            if i % 4 == 0:
                t.clear(P, line=70)  # window start: drops last epoch's partial window at i == 0
            t.backward(fresh=P if i % 4 == 0 else (), accumulated=P if i % 4 else (), line=71,
                       loss_scale_factor=0.25, batch=[0, e, i])
            if (i + 1) % 4 == 0:
                t.step(line=72)
    assert findings(t, "misplaced-zero-grad") == []
    assert findings(t, "accumulation-leftover") == []


def test_misplaced_zero_grad_still_found_inside_an_epoch():
    t = builder()
    epoch(t, 0)
    for i in range(8):
        t.clear(P, line=80)  # before every micro-batch: the real bug
        t.backward(fresh=P, line=81, batch=[0, 0, i])
        if (i + 1) % 4 == 0:
            t.step(line=82)
    assert [f.location.line for f in findings(t, "misplaced-zero-grad")] == [80]


def clip(t: TraceBuilder, pids, total, line=9):
    t.put(ev.clip(via="clip_grad_norm_", params=list(pids), with_grad=list(pids), untracked=0,
                  limit=1.0, norm_type=2.0, norm_only=False, total_norm=total, edited=[]), line)


def skip_loop(t: TraceBuilder, skipped, total_of, clip_pids=(0, 1), n=8):
    """zero_grad L5 → backward L6 → clip L9 → (step L10 unless skipped)."""
    t.optimizer(0, [0, 1], line=3)
    for i in range(n):
        t.clear([0, 1], line=5)
        t.backward(fresh=[0, 1], line=6)
        clip(t, clip_pids, total_of(i))
        if i not in skipped:
            t.step(0, line=10)
    return t.trace


def test_step_skipped_on_nonfinite_clip_norm_is_silent():
    trace = skip_loop(TraceBuilder(), {2, 4, 5, 6}, lambda i: "inf" if i in {2, 4, 5, 6} else 0.5)
    assert slugs(trace) == []


def test_nonfinite_norm_of_other_params_does_not_excuse_the_drop():
    trace = skip_loop(TraceBuilder(), {2, 4, 5, 6}, lambda i: "nan" if i in {2, 4, 5, 6} else 0.5,
                      clip_pids=(1,))
    assert slugs(trace) == [("misplaced-zero-grad", 5)]


def test_rare_skip_with_finite_gradients_is_silent():
    # a loss-spike skip: one update in eight, the clear otherwise runs after a step
    trace = skip_loop(TraceBuilder(), {3}, lambda i: 0.5)
    assert slugs(trace) == []


def test_clear_at_top_of_two_step_accumulation_is_still_misplaced():
    t = TraceBuilder()
    t.optimizer(0, [0], line=3)
    for i in range(8):
        t.clear([0], line=5)
        t.backward(fresh=[0], line=6)
        if i % 2 == 1:
            t.step(0, line=8)
    assert slugs(t.trace) == [("misplaced-zero-grad", 5)]


def test_rare_clear_between_backward_and_step_is_still_misplaced():
    # the clear at L7 only runs on some updates, but every time it runs it drops the backward
    t = TraceBuilder()
    t.optimizer(0, [0], line=3)
    for i in range(8):
        t.clear([0], line=5)
        t.backward(fresh=[0], line=6)
        if i == 3:
            t.clear([0], line=7)
        t.step(0, line=8)
    assert slugs(t.trace) == [("misplaced-zero-grad", 7)]


def sam_loop(edited: bool):
    """SAM: backward L11 → (weights perturbed by hand) → clear L19 → backward L20 → step L24 → clear L25."""
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=3)
    for i in range(4):
        t.backward(fresh=[0, 1], line=11)
        t.clear([0, 1], line=19)
        t.backward(fresh=[0, 1], line=20)
        t.put(ev.step_begin(opt=0, norm_pids=None, norms=None,
                            edited_params=[0, 1] if edited and i > 0 else []), 24)
        t.step(0, line=24)
        t.clear([0, 1], line=25)
    return t.trace


def test_sam_ascent_backward_dropped_after_perturbing_the_weights_is_silent():
    assert slugs(sam_loop(edited=True)) == []


def test_clear_between_two_losses_without_weight_edits_is_still_misplaced():
    assert slugs(sam_loop(edited=False)) == [("misplaced-zero-grad", 19)]


def test_misplaced_zero_grad_between_backward_and_step():
    t = TraceBuilder()
    t.optimizer(0, [0], line=3)
    for _ in range(2):
        t.backward(fresh=[0], line=6)
        t.clear([0], line=7)
        t.step(0, line=8)
    assert slugs(t.trace) == [("misplaced-zero-grad", 7)]


# -- gradients collected by a loop that steps nothing (an EWC Fisher information) -------------
_FISHER = """
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
model = nn.Linear(6, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
fisher = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
for batch in range(3):
    x = torch.randn(8, 6)
    model.zero_grad()
    F.cross_entropy(model(x), x[:, :2].argmax(1)).backward()
    for n, p in model.named_parameters():
        fisher[n] += p.grad ** 2
for step in range(3):
    x = torch.randn(8, 6)
    loss = F.cross_entropy(model(x), x[:, :2].argmax(1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def _run(tmp_path, text):
    from graddoctor.options import CheckOptions
    from graddoctor.run.session import run_check

    path = tmp_path / "script.py"
    path.write_text(text)
    report = run_check(CheckOptions(target=str(path)))
    return [f.rule for f in report.findings]


def test_a_fisher_loop_that_reads_the_gradients_and_steps_nothing_is_not_a_misplaced_clear(tmp_path):
    assert "misplaced-zero-grad" not in _run(tmp_path, _FISHER)


def test_a_training_loop_that_reads_the_gradients_and_steps_is_still_one(tmp_path):
    # the clear between backward and step, with the gradient norms logged: the loop steps
    text = _FISHER.replace(
        "    optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()\n",
        "    loss.backward()\n    norms = [p.grad.norm() for p in model.parameters()]\n"
        "    optimizer.zero_grad()\n    optimizer.step()\n")
    assert "misplaced-zero-grad" in _run(tmp_path, text)


def test_an_epoch_start_clear_beside_a_clear_after_the_step_is_to_be_removed(tmp_path):
    # YOLOv5's loop: step and clear every 4 batches, and a clear before each epoch's batches
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        nb, accumulate, last_opt_step = 10, 4, -1
        for epoch in range(3):
            optimizer.zero_grad()
            for i in range(nb):
                ni = i + nb * epoch
                loss = nn.functional.mse_loss(model(torch.randn(16, 8)), torch.randn(16, 1))
                (loss / accumulate).backward()
                if ni - last_opt_step >= accumulate:
                    optimizer.step()
                    optimizer.zero_grad()
                    last_opt_step = ni
    """))
    report = run_check(CheckOptions(target=str(script)))
    found = [f for f in report.findings if f.rule == "misplaced-zero-grad"]
    assert [f.location.line for f in found] == [9]
    assert found[0].evidence["cleared_after_step_at"] == 16
    assert "remove this clear" in found[0].fix and "line 16" in found[0].fix
