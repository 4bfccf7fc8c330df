"""cells-read-transposed (GD278): the ``cells_transposed`` event of instrument/cellswap.py for a
dense map read at the mirrored cells of its loss's positives, the source lookup of the
subscript, and the rule on small scripts run in process."""

from __future__ import annotations

import ast
import textwrap

import pytest
import torch

from graddoctor.findings import Severity
from graddoctor.instrument.cellswap import read_cells
from graddoctor.options import CheckOptions
from graddoctor.rules.cells_read_transposed import swapped_subscripts
from graddoctor.run.session import run_check

SLUG = "cells-read-transposed"

SCRIPT = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
net = nn.Conv2d(2, 5, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for step in range(4):
    out = net(torch.randn(6, 2, 8, 8))
    gx, gy = torch.randint(0, 8, (6,)), torch.randint(0, 8, (6,))
    b = torch.arange(6)
    obj = torch.zeros(6, 8, 8)
    obj[b, gy, gx] = 1.0
    reg = {read}
    loss = F.binary_cross_entropy_with_logits(out[:, 0], obj) + F.l1_loss(reg, torch.rand(6, 4))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _check(tmp_path, read):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(read=read))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule == SLUG]


def test_a_map_read_at_the_mirrored_cells_is_a_warning_at_the_subscript(tmp_path):
    (f,) = _check(tmp_path, "out[:, 1:][b, :, gx, gy]")
    assert f.severity is Severity.WARNING and f.location.line == 14
    assert f.evidence["shape"] == [6, 4, 8, 8] and f.evidence["cells"] >= 2
    assert f.related and f.related[0].location.line == 17  # the backward


@pytest.mark.parametrize("read", [
    "out[:, 1:][b, :, gy, gx]",                        # as the target
    "out[:, 1:].permute(0, 1, 3, 2)[b, :, gx, gy]",    # an x-major view read (x, y)
    "out[:, 1:].transpose(2, 3)[b, :, gx, gy]",
])
def test_reads_at_the_positives_stay_silent(tmp_path, read):
    assert _check(tmp_path, read) == []


def test_read_cells_swaps_back_a_transposed_map():
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    b, r, c = torch.tensor([0, 1]), torch.tensor([1, 2]), torch.tensor([3, 0])
    sizes, cells = read_cells(x[b, :, r, c].grad_fn)
    assert sizes == (2, 3, 4, 4) and cells == {(0, 1, 3), (1, 2, 0)}
    _, cells = read_cells(x.transpose(2, 3)[b, :, r, c].grad_fn)
    assert cells == {(0, 3, 1), (1, 0, 2)}
    assert read_cells(x.permute(0, 2, 3, 1)[b, r, c].grad_fn) is None  # the last axis not indexed
    assert read_cells(x[x > 0].grad_fn) is None  # a boolean mask


def test_swapped_subscripts_finds_the_read_against_the_written_order():
    tree = ast.parse(textwrap.dedent("""\
        obj[b, gy, gx] = 1.0
        reg = reg_map[b, :, gx, gy]
        cls = cls_map[b, :, gy, gx]
        a = adj[i, j]
        """))
    assert swapped_subscripts(tree) == [(2, "reg_map[b, :, gx, gy]")]
