"""loss-shape-broadcast (GD211) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from aside_traces import check, loss, update
from graddoctor.findings import Severity
from graddoctor.rules.loss_shape_broadcast import LossShapeBroadcast
from graddoctor.trace import TraceBuilder


def test_column_prediction_against_vector_target_in_training():
    t = TraceBuilder()
    t.optimizer(0, [0])
    update(t, 20)
    loss(t, 18)
    update(t, 20)
    [f] = check(LossShapeBroadcast, t)
    assert (f.location.line, f.severity, f.step) == (18, Severity.WARNING, 2)  # the step it feeds
    assert "input (8, 1) with target (8,)" in f.message and "(8, 8)" in f.message
    assert "mean of the batch's targets" in f.message
    assert f.evidence["shape"] == [8, 8] and f.evidence["grad"] is True


def test_l1_fits_the_median_and_a_metric_says_so():
    t = TraceBuilder()
    loss(t, 5, fn="l1_loss", a=(4,), b=(4, 1), shape=(4, 4))
    loss(t, 9, fn="huber_loss", grad=False, reduction="none")
    found = check(LossShapeBroadcast, t)
    assert [f.severity for f in found] == [Severity.WARNING, Severity.WARNING]
    assert "median" in found[0].message
    assert "not the per-sample error" in found[1].message and found[1].step is None
    assert "reduction='none' returns that (8, 8) tensor" in found[1].message


def test_a_pairwise_broadcast_is_only_info():
    t = TraceBuilder()
    loss(t, 7, a=(5, 1, 3), b=(4, 3), shape=(5, 4, 3), reduction="none")  # different data, kept
    loss(t, 8, a=(6, 1, 3), b=(1, 6, 3), shape=(6, 6, 3))  # x[:, None] against x[None]: same rank
    loss(t, 9, a=(6, 1), b=(1, 6), shape=(6, 6))
    loss(t, 10, a=(6, 1), b=(1, 6), shape=(6, 6), reduction="none")  # keeps the pairwise tensor: meant
    loss(t, 11, a=(6, 1), b=(6,), shape=(6, 6), reduction="none")  # misaligned all the same
    found = check(LossShapeBroadcast, t)
    assert [(f.location.line, f.severity) for f in found] == [(8, Severity.INFO), (9, Severity.INFO),
                                                             (11, Severity.WARNING)]
    assert "pairwise" in found[0].message and "(6, 1) with target (1, 6)" in found[1].message


def test_misaligned_layouts():
    from graddoctor.rules.loss_shape_broadcast import misaligned

    assert misaligned([8, 1], [8]) and misaligned([8], [8, 1]) and misaligned([4, 1, 5, 5], [4, 5, 5])
    assert misaligned([6, 1, 3], [6, 3])
    assert not misaligned([6, 1], [1, 6]) and not misaligned([5, 1, 3], [4, 3]) and not misaligned([8, 2], [8])


def test_a_target_sliced_from_a_tensor_shaped_like_the_prediction():
    import torch
    from graddoctor.instrument.losses import _narrowed_from
    pred, y = torch.zeros(8, 3, requires_grad=True), torch.randn(8, 3)
    assert _narrowed_from(pred, y[:, :1]) == [8, 3]
    assert _narrowed_from(pred, y[:, 0].unsqueeze(1)) == [8, 3]  # any view of y's column
    assert _narrowed_from(pred, y[:, 0].clone().unsqueeze(1)) is None  # a column of its own
    assert _narrowed_from(pred, torch.randn(8, 2)[:, :1]) is None  # the wider tensor is not pred's
    assert _narrowed_from(pred, torch.randn(8, 1)) is None
    t = TraceBuilder()
    t.optimizer(0, [0])
    from graddoctor import events as ev
    t.put(ev.loss_broadcast(fn="smooth_l1_loss", input_shape=[8, 3], target_shape=[8, 1],
                            shape=[8, 3], reduction="mean", grad=True, narrowed_from=[8, 3]), 7)
    update(t, 9)
    [f] = check(LossShapeBroadcast, t)
    assert f.severity is Severity.WARNING and f.location.line == 7
    assert "a slice of a (8, 3) tensor" in f.message and f.evidence["narrowed_from"] == [8, 3]
