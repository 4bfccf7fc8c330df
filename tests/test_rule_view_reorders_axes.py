"""view-reorders-axes (GD154): a view/reshape whose output is its input's axes in another order,
where a transpose or permute was meant."""

from __future__ import annotations

import sys

import pytest
import torch

from graddoctor import events as ev
from graddoctor.instrument.viewaxes import (_class_first, _normalised_rows, _skewed, _target_shape,
                                            class_rows, reordered)
from graddoctor.instrument.graphpaths import post_order
from graddoctor.rules.view_reorders_axes import axis_order
from rule_traces import builder, findings, only

SLUG = "view-reorders-axes"


@pytest.mark.parametrize("shape_in, shape_out", [
    ((16, 24, 6), (16, 6, 24)),  # (B, T, C) viewed as (B, C, T)
    ((8, 3, 6, 5), (8, 6, 5, 3)),  # NCHW viewed as NHWC
    ((8, 12, 8, 8), (8, 64, 12)),  # a map viewed as tokens without flatten(2).transpose(1, 2)
    ((8, 64, 24), (8, 24, 8, 8)),  # tokens put back on a grid without their transpose
    ((16, 4, 10, 8), (16, 10, 32)),  # heads merged without transpose(1, 2)
    # channels folded into the batch without their permute: a regrouping only by the
    # coincidence that C divides L
    ((16, 48, 3), (48, 48)),
    ((32, 336, 7), (224, 336)),
    ((8, 64, 4, 16), (32, 64, 16)),  # heads folded into the batch without transpose(1, 2)
])
def test_reorderings_are_suspect(shape_in, shape_out):
    assert reordered(shape_in, shape_out)


@pytest.mark.parametrize("shape_in, shape_out", [
    ((16, 10, 32), (16, 10, 4, 8)),  # heads split
    ((16, 10, 4, 8), (16, 10, 32)),  # heads merged after their transpose
    ((16, 10, 32), (16, 5, 64)),  # two frames stacked
    ((4, 4, 4, 8), (4, 32, 4)),  # a detection head's permute(...).view(B, -1, 4) on a 4 x 4 map
    ((4, 3, 4, 8), (4, 24, 4)),  # the same on a 3 x 4 map: a size 4 axis besides the coordinates
    ((4, 1, 12), (4, 12, 1)),  # a length-1 axis moved
    ((4, 12, 12), (4, 12, 12)),  # unchanged
    ((4, 12, 12), (4, 144)),  # flattened
])
def test_splits_merges_and_regroupings_in_order_are_not(shape_in, shape_out):
    assert not reordered(shape_in, shape_out)


def test_the_target_shape_is_read_from_every_way_of_writing_it():
    x = torch.zeros(2, 3, 4)
    assert _target_shape(x, (x, 2, 4, 3), {}) == (2, 4, 3)
    assert _target_shape(x, (x, (2, -1, 3)), {}) == (2, 4, 3)
    assert _target_shape(x, (x, torch.Size([6, 4])), {}) == (6, 4)
    assert _target_shape(x, (x,), {"shape": (4, 6)}) == (4, 6)
    assert _target_shape(x, (x, torch.float16), {}) is None  # view(dtype)
    assert _target_shape(x, (x, -1, -1), {}) is None


def test_the_axis_order_is_the_permute_that_was_meant():
    assert axis_order((16, 24, 6), (16, 6, 24)) == [0, 2, 1]
    assert axis_order((8, 12, 8, 8), (8, 64, 12)) == [0, 2, 3, 1]
    assert axis_order((8, 64, 24), (8, 24, 8, 8)) == [0, 2, 1]
    assert axis_order((16, 4, 10, 8), (16, 10, 32)) == [0, 2, 1, 3]


def _trace(params, stepped=(0, 1)):
    t = builder(params=list(stepped))
    t.put(ev.view_axes(shape_in=[16, 24, 6], shape_out=[16, 6, 24], params=list(params)), line=9)
    t.clear(list(stepped), line=10)
    t.backward(fresh=list(stepped), line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_when_an_optimizer_trains_what_reads_the_view():
    f = only(_trace([0, 1]), SLUG)
    assert f.location.line == 9
    assert f.evidence["order"] == [0, 2, 1]


def test_the_rule_is_silent_when_nothing_stepped_reads_it():
    assert findings(_trace([7]), SLUG) == []


def test_the_relative_shift_of_padded_scores_is_not_a_reordering():
    scores = torch.randn(2, 3, 5, 5, requires_grad=True)
    padded = torch.cat([torch.zeros(2, 3, 5, 1), scores], dim=-1)  # (2, 3, 5, 6)
    assert reordered(padded.shape, (2, 3, 6, 5))  # the sizes alone read as a reordering
    assert _skewed(padded, (2, 3, 5, 6), (2, 3, 6, 5))
    assert _skewed(torch.nn.functional.pad(scores, (1, 0)), (2, 3, 5, 6), (2, 3, 6, 5))
    features = torch.randn(2, 6, 4, requires_grad=True) * 1.0  # (B, T, C) from a layer
    assert not _skewed(features, (2, 6, 4), (2, 4, 6))
    wide = torch.cat([torch.randn(2, 6, 2), torch.randn(2, 6, 2, requires_grad=True)], -1)
    assert not _skewed(wide, (2, 6, 4), (2, 4, 6))  # concatenated features: sizes 6 and 4


@pytest.mark.parametrize("shape_in, shape_out", [
    ((8, 4, 16, 16), (2048, 4)),  # NCHW scores, W a multiple of C: a regrouping in memory order
    ((6, 5, 20), (120, 5)),  # NCT scores
    ((2, 3, 6, 6, 6), (216, 3)),  # a volume's scores
])
def test_channel_first_scores_cut_into_rows_of_classes_are_candidates(shape_in, shape_out):
    assert not reordered(shape_in, shape_out)  # the sizes alone read as a regrouping
    assert class_rows(shape_in, shape_out)


@pytest.mark.parametrize("shape_in, shape_out", [
    ((8, 16, 16, 4), (2048, 4)),  # NHWC: the classes already last
    ((8, 4, 16, 4), (512, 4)),  # the last axis has C's size: may be the classes
    ((8, 12), (24, 4)),  # a packed (B, K * C) of K heads
    ((8, 4, 16, 16), (8, 4, 256)),  # rows of a length other than C
    ((8, 4, 1), (8, 4)),  # nothing after the class axis
])
def test_other_flattenings_are_not(shape_in, shape_out):
    assert not class_rows(shape_in, shape_out)


def _view_node(out):
    return out.grad_fn.next_functions[0][0]


def test_rows_count_only_when_a_softmax_over_their_last_axis_reads_them():
    conv = torch.nn.Conv2d(3, 4, 1)
    scores = conv(torch.randn(2, 3, 4, 8))
    over_rows = torch.log_softmax(scores.reshape(-1, 4), dim=-1)
    over_rows_positive = torch.softmax(scores.reshape(-1, 4), dim=1)
    over_columns = torch.softmax(scores.reshape(-1, 4), dim=0)
    for out, normalised in ((over_rows, True), (over_rows_positive, True), (over_columns, False)):
        nodes = post_order(out.grad_fn, 1000)
        assert (id(_view_node(out)) in _normalised_rows(nodes)) is normalised


def test_the_channel_axis_must_come_from_a_channel_first_op():
    conv = torch.nn.Conv2d(3, 4, 1)
    from_conv = torch.relu(conv(torch.randn(2, 3, 4, 8))).reshape(-1, 4)
    assert _class_first(from_conv.grad_fn, (2, 4, 4, 8))
    linear = torch.nn.Linear(3, 8)
    from_linear = linear(torch.randn(2, 4, 4, 3)).reshape(-1, 4)  # (B, T, T, K * C): no channels
    assert not _class_first(from_linear.grad_fn, (2, 4, 4, 8))


def test_class_rows_get_their_own_message_and_a_permute_fix():
    t = builder(params=[0, 1])
    t.put(ev.view_axes(shape_in=[8, 4, 16, 16], shape_out=[2048, 4], params=[0], classes=4), line=9)
    t.clear([0, 1], line=10)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    f = only(t, SLUG)
    assert f.location.line == 9
    assert "class scores of one position" in f.message
    assert f.evidence["classes"] == 4 and f.evidence["order"] == [0, 2, 3, 1]


def test_class_rows_that_loss_input_mismatch_reports_are_left_to_it():
    t = builder(params=[0, 1])
    t.put(ev.view_axes(shape_in=[8, 4, 16, 16], shape_out=[2048, 4], params=[0], classes=4), line=9)
    t.put(ev.loss_input(fn="cross_entropy", problem="rows", classes=4, normalised=None,
                        source=[8, 4, 16, 16]), line=11)
    t.clear([0, 1], line=10)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    assert findings(t, SLUG) == []


def test_a_reshaped_batch_is_told_from_other_views_of_its_memory():
    # data reshaped outside a forward is matched with the input a layer of the loss's graph
    # saved by where its values start, its shape and its strides: a transpose of the same
    # memory with the same shape is another tensor
    from graddoctor.instrument.viewaxes import _memory
    frames = torch.randn(8, 24, 10)
    scrambled = frames.reshape(8, 10, 24)
    transposed = frames.transpose(1, 2)
    assert _memory(scrambled) != _memory(transposed)
    assert _memory(scrambled) == _memory(frames.view(8, 10, 24))


def test_a_one_hot_target_viewed_reordered_names_the_target():
    t = builder(params=[0, 1])
    t.put(ev.view_axes(shape_in=[8, 32, 32, 3], shape_out=[8, 3, 32, 32], params=[0, 1],
                       one_hot=True), line=9)
    t.clear([0, 1], line=10)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    f = only(t, SLUG)
    assert f.location.line == 9 and f.evidence["one_hot"] and "one-hot encoding" in f.message
    assert f.evidence["order"] == [0, 3, 1, 2]


def test_the_watcher_holds_a_one_hot_viewed_with_its_classes_moved():
    from graddoctor.instrument.viewaxes import ViewAxesWatcher

    class Finder:
        def is_user_file(self, name):
            return True

    class Rec:
        finder = Finder()

        def here(self):
            return ("script.py", 3)

        def internal_error(self, where, exc):
            raise exc

    w = ViewAxesWatcher(Rec())
    frame = sys._getframe()
    one_hot = torch.nn.functional.one_hot(torch.randint(0, 3, (4, 5, 6)), 3)
    w._one_hot(one_hot, (one_hot, 4, 3, 5, 6), {}, frame)
    assert list(w._one_hots) == [((4, 5, 6, 3), (4, 3, 5, 6))]
    w._one_hots.clear()
    w._one_hot(one_hot, (one_hot, 4 * 5 * 6, 3), {}, frame)  # rows of classes: a merge in order
    w._one_hot(one_hot.permute(0, 3, 1, 2).contiguous(), (one_hot, 4, 3, 5, 6), {}, frame)  # not one-hot along its last axis
    w._one_hot(torch.randint(0, 3, (4, 5, 6, 3)), (one_hot, 4, 3, 5, 6), {}, frame)  # labels, not one-hot
    assert w._one_hots == {}
