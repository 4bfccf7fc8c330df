"""unscaled-accumulation (GD204) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.rules.engine import analyze
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import P, builder, clip, findings, only


def accumulation(t, k=4, windows=3, factor=1.0, line=40, step_line=42, edit=False, tail=0):
    for w in range(windows):
        for i in range(k):
            t.backward(fresh=P if i == 0 else (), accumulated=P if i else (), line=line,
                       loss_scale_factor=factor, batch=[0, 0, w * k + i])
        if edit:
            t.event("grad_edit", 41, opt=0, params=P)
        t.step(line=step_line)
        t.clear(P, line=43)
    for i in range(tail):  # a flushed tail: a shorter window
        t.backward(fresh=P if i == 0 else (), accumulated=P if i else (), line=line,
                   loss_scale_factor=factor)
    if tail:
        t.step(line=step_line)


def test_unscaled_accumulation_found_with_sgd():
    t = builder("SGD")
    accumulation(t, tail=1)
    f = only(t, "unscaled-accumulation")
    assert f.location.line == 40 and f.severity is Severity.WARNING
    assert f.evidence["k"] == 4 and f.evidence["windows"] == 3


def test_divided_loss_is_silent():
    for factor in (0.25, 1 / 8, 1 / (4 * 32)):  # / k, / 2k, / (k * batch)
        t = builder("SGD")
        accumulation(t, factor=factor, tail=1)
        assert findings(t, "unscaled-accumulation") == [], factor


def test_unknown_factor_is_silent():
    t = builder("SGD")
    accumulation(t, factor=None)
    assert findings(t, "unscaled-accumulation") == []


def test_hand_rescaled_gradients_are_silent():
    t = builder("SGD")
    accumulation(t, edit=True)
    assert findings(t, "unscaled-accumulation") == []


def test_gradients_rescaled_before_a_clip_are_silent():
    # p.grad.mul_(1 / n) then clip_grad_norm_: the clip took the edit up (its ``edited``), the
    # step's pre hook saw none; a clip that found nothing edited changes nothing
    t = builder("SGD")
    for w in range(3):
        for i in range(4):
            t.backward(fresh=P if i == 0 else (), accumulated=P if i else (), line=40,
                       loss_scale_factor=1.0, batch=[0, 0, w * 4 + i])
        clip(t, line=41, edited=P)
        t.step(line=42)
        t.clear(P, line=43)
    assert findings(t, "unscaled-accumulation") == []
    t = builder("SGD")
    for w in range(3):
        for i in range(4):
            t.backward(fresh=P if i == 0 else (), accumulated=P if i else (), line=40,
                       loss_scale_factor=1.0, batch=[0, 0, w * 4 + i])
        clip(t, line=41)
        t.step(line=42)
        t.clear(P, line=43)
    assert only(t, "unscaled-accumulation").severity is Severity.WARNING


def test_other_factor_is_info():
    t = builder("SGD")
    accumulation(t, factor=0.5)
    f = only(t, "unscaled-accumulation")
    assert f.severity is Severity.INFO and f.evidence["loss_scale_factor"] == 0.5


def test_adam_without_clipping_is_info_with_clipping_warning():
    t = builder("AdamW")
    accumulation(t)
    assert only(t, "unscaled-accumulation").severity is Severity.INFO
    t = builder("AdamW")
    accumulation(t)
    clip(t)
    assert only(t, "unscaled-accumulation").severity is Severity.WARNING


def test_several_losses_at_different_lines_are_not_accumulation():
    t = builder("SGD")
    for _ in range(3):
        t.clear(P)
        t.backward(fresh=P, line=50, loss_scale_factor=1.0)
        t.backward(accumulated=P, line=51, loss_scale_factor=1.0)
        t.step()
    assert findings(t, "unscaled-accumulation") == []


def epochs_with_leftover_windows(t, factor, sizes=(3, 2), epochs=3):
    """Each epoch: a full window of sizes[0] micro-batches, then the epoch's shorter leftover."""
    for e in range(epochs):
        for size in sizes:
            for i in range(size):
                t.backward(fresh=P if i == 0 else (), accumulated=P if i else (), line=40,
                           loss_scale_factor=factor, batch=[e, 0, i])
            t.step(line=42)
            t.clear(P, line=43)


def test_leftover_windows_divided_by_the_full_window_are_silent():
    """accelerate (gradient_accumulation_steps=3, 5 batches an epoch) divides the epoch's last
    window of 2 by 3 as well: as many short windows as full ones must not make 1/3 'odd'."""
    t = builder("AdamW")
    epochs_with_leftover_windows(t, 1 / 3)
    assert findings(t, "unscaled-accumulation") == []
    t = builder("AdamW")
    epochs_with_leftover_windows(t, 1 / 5)  # divides by neither window: still asked about
    assert only(t, "unscaled-accumulation").severity is Severity.INFO
    t = builder("SGD")
    epochs_with_leftover_windows(t, 1.0)  # not divided at all: still the bug
    assert only(t, "unscaled-accumulation").severity is Severity.WARNING


def reported(trace) -> list[tuple[str, str, int]]:
    found, errors = analyze(trace)
    assert not errors
    return sorted((f.rule, f.severity.value, f.location.line) for f in found)


def windows(factor_rows) -> TraceBuilder:
    t = TraceBuilder()
    t.optimizer(0, [0], line=3)
    for row in factor_rows:
        for j, f in enumerate(row):
            t.backward(fresh=[0] if j == 0 else [], accumulated=[] if j == 0 else [0],
                       loss_scale_factor=f, line=15)
        t.step(0, line=16)
        t.clear([0], line=17)
    return t.trace


def test_factors_adding_up_to_one_are_a_weighted_mean():
    rows = [(8 / 20, 5 / 20, 7 / 20), (4 / 18, 8 / 18, 6 / 18), (3 / 19, 8 / 19, 8 / 19)]
    assert reported(windows(rows)) == []


def test_factors_adding_up_to_a_half_are_a_weighted_mean_per_sample():
    rows = [(0.2, 0.1, 0.2), (0.25, 0.125, 0.125)]
    assert reported(windows(rows)) == []


def test_factors_adding_up_to_more_than_one_stay_odd():
    rows = [(0.4, 0.5, 0.3), (0.6, 0.3, 0.3)]
    assert reported(windows(rows)) == [("unscaled-accumulation", "info", 15)]


def test_undivided_window_still_warns():
    rows = [(1.0, 1.0, 1.0), (1.0, 1.0, 1.0)]
    assert [f[0] for f in reported(windows(rows))] == ["unscaled-accumulation"]


def _split_branches(t, factor, same_batch_last=False, batches=True, windows=3, k=4):
    """One loop's k micro-batches: all but the last backpropagated at line 60 (under no_sync),
    the last at line 62, each on its own DataLoader batch (``same_batch_last``: the last one
    reuses a batch, as a second loss term of the same micro-batch would)."""
    for w in range(windows):
        for i in range(k):
            index = w * k + (i - 1 if same_batch_last and i == k - 1 else i)
            t.backward(fresh=P if i == 0 else (), accumulated=P if i else (),
                       line=60 if i < k - 1 else 62, loss_scale_factor=factor,
                       batch=[0, 0, index] if batches else None)
        t.step(line=63)
        t.clear(P, line=64)
    return t


def test_micro_batches_split_between_two_branches_are_one_window():
    f = only(_split_branches(builder("SGD"), factor=1.0), "unscaled-accumulation")
    assert f.evidence["k"] == 4 and f.evidence["backward_lines"] == [60, 62]
    assert [r.location.line for r in f.related][0] == 62
    assert findings(_split_branches(builder("SGD"), factor=0.25), "unscaled-accumulation") == []


def test_a_second_line_on_a_batch_already_used_or_unknown_stays_apart():
    """Without the batches to tell micro-batches from a micro-batch's second loss term, the
    lines stay apart (a window of 3 at line 60, the odd factor an info at most)."""
    for t in (_split_branches(builder("SGD"), factor=0.25, same_batch_last=True),
              _split_branches(builder("SGD"), factor=0.25, batches=False)):
        found = findings(t, "unscaled-accumulation")
        assert all(f.severity is Severity.INFO and f.evidence["k"] == 3 for f in found)


def test_loss_multiplied_by_k_is_a_warning_with_sgd():
    # `loss = crit(out, y) * k` where `/ k` was meant: k * k times one batch's gradient
    t = builder("SGD")
    accumulation(t, factor=4.0)
    f = only(t, "unscaled-accumulation")
    assert f.severity is Severity.WARNING and f.evidence["multiplied"] is True
    assert "multiplied by 4" in f.message and "16x" in f.message


def test_loss_multiplied_by_k_with_adam_is_info():
    t = builder("Adam")
    accumulation(t, factor=4.0)
    f = only(t, "unscaled-accumulation")
    assert f.severity is Severity.INFO and f.evidence["multiplied"] is True


def test_loss_weight_below_k_stays_an_info():
    t = builder("SGD")
    accumulation(t, factor=2.0)
    f = only(t, "unscaled-accumulation")
    assert f.severity is Severity.INFO and "multiplied" not in f.evidence


def test_per_step_returns_weighting_one_episode_are_not_accumulation():
    """REINFORCE's `(-log p * R).backward()` per time step, R the discounted return: the factors
    differ from one backward to the next and exceed 1, weighing the terms of one objective."""
    returns, rows = 0.0, []
    row = []
    for _ in range(6):
        returns = 1.0 + 0.98 * returns
        row.append(returns)
    rows = [tuple(row), tuple(row)]
    assert reported(windows(rows)) == []
