"""pixels-not-scaled (GD159): the ``pixels_unscaled`` event of instrument/pixelscale.py for an
image batch that reaches a layer as raw 0..255 values, the value test and the source helper it
is judged and placed with, and the rule's finding."""

from __future__ import annotations

import textwrap

import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.analysis.source import float_conversion_lines
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.pixelscale import raw_pixels, scaled_twice
from rule_traces import builder, findings, only

SLUG = "pixels-not-scaled"


def _event():
    return ev.pixels_unscaled(module="Conv2d", shape=[8, 3, 8, 8], low=0.0, high=255.0, over=0.87)


def test_the_event_is_a_warning_at_the_layers_line_when_the_source_shows_no_conversion():
    t = builder()
    t.put(_event(), 12)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 12
    assert f.evidence == {"module": "Conv2d", "shape": [8, 3, 8, 8], "low": 0.0, "high": 255.0,
                          "over": 0.87}
    assert "8×3×8×8" in f.message and "255" in f.fix and findings(builder(), SLUG) == []


def test_the_finding_moves_to_the_one_statement_that_makes_the_batch_float(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        threshold = images.float().mean() > 100
        for batch, y in loader:
            x = batch.float()
            loss = criterion(model(x), y)
        """))
    t = builder()
    t.path = str(script)
    t.put(_event(), 4)
    f = only(t, SLUG)
    assert f.location.line == 3 and "`x = batch.float()`" in f.message


def test_float_conversion_lines_leave_out_scaled_and_reduced_statements(tmp_path):
    script = tmp_path / "m.py"
    script.write_text(textwrap.dedent("""\
        a = x.float()
        b = x.float() / 255
        c = x.to(torch.float32).mean()
        d = model(x.to(dtype=torch.float16))
        e = x.to("cpu")
        f = (x.double() - mean)
        g = x.type(torch.float)
        h = x.float() > 3
        """))
    assert [line for line, _ in float_conversion_lines(str(script))] == [1, 4, 7]
    assert float_conversion_lines(str(tmp_path / "missing.py")) == []


def test_raw_pixels_needs_integers_in_0_255_reaching_past_32():
    torch.manual_seed(0)
    pixels = torch.randint(0, 256, (4, 3, 8, 8)).float()
    assert raw_pixels(pixels) is not None
    assert raw_pixels(pixels / 255) is None  # scaled
    assert raw_pixels(pixels - 128) is None  # below 0
    assert raw_pixels(pixels + 0.5) is None  # not integers
    assert raw_pixels(torch.randint(0, 12, (4, 3, 8, 8)).float()) is None  # small codes
    sparse = torch.zeros(4, 100)
    sparse[0, 0] = 200.0
    assert raw_pixels(sparse) is None  # one large count among zeros
    assert raw_pixels(torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)) is None  # not float


def _events(prepare, linear=False, steps=2) -> list[dict]:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(192, 2)) if linear else \
            nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(steps):
            images = torch.randint(0, 256, (8, 3, 8, 8), dtype=torch.uint8)
            loss = nn.functional.cross_entropy(model(prepare(images)), torch.randint(0, 2, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [dict(e.data) for e in rec.trace.of_kind("pixels_unscaled")]


def test_the_watcher_notes_raw_pixels_once_and_stays_silent_on_scaled_ones():
    found = _events(lambda x: x.float())
    assert len(found) == 1 and found[0]["module"] == "Conv2d" and found[0]["shape"] == [8, 3, 8, 8]
    assert _events(lambda x: x.float(), linear=True)[0]["module"] == "Linear"
    assert _events(lambda x: x.float() / 255) == []
    assert _events(lambda x: (x.float() - 127.5) / 64) == []


def test_scaled_twice_needs_values_within_one_255th_spread_over_that_range():
    torch.manual_seed(0)
    pixels = torch.randint(0, 256, (4, 3, 8, 8)).float()
    assert scaled_twice(pixels / 255 / 255) is not None
    assert scaled_twice((pixels / 255 * 2 - 1) / 255) is not None  # -1..1, then again
    assert scaled_twice(pixels / 255) is None  # once
    assert scaled_twice(torch.full((4, 3, 8, 8), 0.002)) is None  # a constant
    sparse = torch.zeros(4, 3, 8, 8)
    sparse[:, :, ::4, ::4] = 1 / 255
    assert scaled_twice(sparse) is None  # a few values over zeros
    assert scaled_twice(pixels[:1, :1, :4, :4] / 255 / 255) is None  # too few values


def test_an_image_divided_twice_points_at_the_division_closest_above_the_layer(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""        data = raw / 255.0
        for x, y in loader:
            x = x.div(255)
            loss = criterion(model(x), y)
        """))
    t = builder()
    t.path = str(script)
    t.put(ev.pixels_scaled_twice(module="Conv2d", shape=[8, 3, 8, 8], low=0.0, high=0.0039), 4)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 3
    assert "`x = x.div(255)`" in f.message and f.evidence["scaled"] == "twice"
    assert f.fix.startswith("divide by 255 once")


def test_the_watcher_notes_an_image_divided_twice():
    found = []
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(2):
            images = torch.randint(0, 256, (8, 3, 8, 8)).float() / 255
            loss = nn.functional.cross_entropy(model(images / 255), torch.randint(0, 2, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    found = [dict(e.data) for e in rec.trace.of_kind("pixels_scaled_twice")]
    assert len(found) == 1 and found[0]["module"] == "Conv2d"
    assert not rec.trace.of_kind("pixels_unscaled")
