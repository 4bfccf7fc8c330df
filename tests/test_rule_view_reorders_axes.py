"""view-reorders-axes (GD154): a view/reshape whose output is its input's axes in another order,
where a transpose or permute was meant."""

from __future__ import annotations

import pytest
import torch

from graddoctor import events as ev
from graddoctor.instrument.viewaxes import _skewed, _target_shape, reordered
from graddoctor.rules.view_reorders_axes import axis_order
from rule_traces import builder, findings, only

SLUG = "view-reorders-axes"


@pytest.mark.parametrize("shape_in, shape_out", [
    ((16, 24, 6), (16, 6, 24)),  # (B, T, C) viewed as (B, C, T)
    ((8, 3, 6, 5), (8, 6, 5, 3)),  # NCHW viewed as NHWC
    ((8, 12, 8, 8), (8, 64, 12)),  # a map viewed as tokens without flatten(2).transpose(1, 2)
    ((8, 64, 24), (8, 24, 8, 8)),  # tokens put back on a grid without their transpose
    ((16, 4, 10, 8), (16, 10, 32)),  # heads merged without transpose(1, 2)
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
