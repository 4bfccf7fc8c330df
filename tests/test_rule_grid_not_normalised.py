"""grid-not-normalised (GD287): the ``grid_scale`` event of instrument/gridscale.py for a grid
given to ``F.grid_sample`` in pixel units or in [0, 1], the value test it is judged with, where
the rule places its finding, and that the wrapper is put back after the first backwards."""

from __future__ import annotations

import textwrap

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.gridscale import judge_grid
from rule_traces import builder, findings, only

SLUG = "grid-not-normalised"


def _event(how="pixels"):
    return ev.grid_scale(how=how, low=-0.1, high=15.2, outside=0.88, coords=2, size=[16, 16],
                         padding="zeros", mode="bilinear", grad=True)


def _base(h=16, w=16, low=-1.0, high=1.0):
    ys, xs = torch.meshgrid(torch.linspace(low, high, h), torch.linspace(low, high, w),
                            indexing="ij")
    return torch.stack([xs, ys], -1)[None].expand(2, -1, -1, -1)


def test_judge_grid_tells_pixels_and_unit_grids_from_normalised_ones():
    ys, xs = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    pixels = torch.stack([xs, ys], -1)[None]
    assert judge_grid(pixels)["how"] == "pixels"
    assert judge_grid(_base(low=0.0))["how"] == "unit"
    assert judge_grid(_base()) is None  # normalised
    assert judge_grid(_base() + 0.3) is None  # a shift: some points past the edge, most inside
    assert judge_grid(_base(low=0.2, high=0.7)) is None  # a zoom into part of [0, 1]
    assert judge_grid(pixels[:, :4, :4]) is None  # too few points to judge
    assert judge_grid(_base() * 1.5) is None  # a zoom out: past the edge, but not pixel-sized
    nan = pixels.clone()
    nan[0, 0, 0, 0] = float("nan")
    assert judge_grid(nan) is None
    assert judge_grid(torch.zeros(2, 16, 16, 4)) is None  # not a grid of 2 or 3 coordinates


def test_the_event_is_a_warning_at_the_line_that_builds_the_grid(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        def warp(img, flow):
            grid = torch.stack([xs + flow[:, 0], ys + flow[:, 1]], -1)
            return F.grid_sample(img, grid, align_corners=True)
        """))
    t = builder()
    t.path = str(script)
    t.put(_event(), 3)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 2
    assert [r.location.line for r in f.related] == [3]
    assert "pixel units" in f.message and "88%" in f.message and "2 * x / (W - 1) - 1" in f.fix
    assert findings(builder(), SLUG) == []


def test_a_unit_grid_and_an_affine_grid_get_their_own_fix(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        grid = F.affine_grid(theta, x.size(), align_corners=False)
        out = F.grid_sample(x, grid)
        out2 = F.grid_sample(x, make_grid())
        """))
    t = builder()
    t.path = str(script)
    t.put(_event(), 2)
    t.put(_event("unit"), 3)
    affine, unit = findings(t, SLUG)
    assert affine.location.line == 1 and "theta[:, :, 2]" in affine.message
    assert "2 * tx_px / W" in affine.fix
    assert unit.location.line == 3 and unit.related == () and "grid * 2 - 1" in unit.fix
    assert "bottom-right quarter" in unit.message


def _events(make_grid, steps=4) -> tuple[list[dict], bool]:
    rec = Recorder(step_budget=None)
    original = F.grid_sample
    with Instrumentation(rec):
        torch.manual_seed(0)
        net = nn.Conv2d(3, 2, 3, padding=1)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for _ in range(steps):
            img = torch.rand(2, 3, 16, 16)
            flow = net(img).permute(0, 2, 3, 1)
            out = F.grid_sample(img, make_grid(flow), align_corners=True)
            loss = (out - img).abs().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        put_back = F.grid_sample is original
    return [dict(e.data) for e in rec.trace.of_kind("grid_scale")], put_back


def test_the_watcher_notes_a_pixel_grid_once_and_puts_grid_sample_back():
    ys, xs = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    pixels = torch.stack([xs, ys], -1)[None]
    found, put_back = _events(lambda flow: pixels + flow)
    assert len(found) == 1 and found[0]["how"] == "pixels" and found[0]["grad"] is True
    assert found[0]["size"] == [16, 16] and found[0]["padding"] == "zeros"
    assert put_back  # the wrapper is gone after the first backwards
    found, put_back = _events(lambda flow: _base() + 0.1 * flow)
    assert found == [] and put_back


def test_a_grid_sampled_without_gradients_is_not_judged():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        with torch.no_grad():
            F.grid_sample(torch.rand(1, 3, 16, 16), _base(low=0.0)[:1], align_corners=True)
    assert rec.trace.of_kind("grid_scale") == []
