"""The pictures: every update's gradient norms (instrument/gradflow.py), the heatmap built from
them (analysis/gradflow.py), the HTML and Markdown reports, --plot. The page in a real browser:
tests/test_browser.py."""

from __future__ import annotations

import math
import os
import re

import pytest
import torch

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.instrument import gradflow as recording
from graddoctor.options import CheckOptions
from graddoctor.report.formats import FORMATS, format_for_output
from graddoctor.run.session import run_check
from graddoctor.trace import TraceBuilder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUGGY = os.path.join(ROOT, "examples", "buggy_train.py")


@pytest.fixture(scope="module")
def buggy():
    """examples/buggy_train.py checked with a picture asked for (33 updates)."""
    return run_check(CheckOptions(target=BUGGY, grad_flow=True))


def test_the_never_cleared_head_climbs_in_the_heatmap(buggy):
    (heat,) = buggy.analysis.heatmaps
    assert heat.source == "recorded"
    assert heat.rows == ["backbone.0", "backbone.2", "head"]
    assert [g[0] for g in heat.groups] == ["backbone", "head"]
    steps = [c for c in heat.columns if c.form == "step"]
    assert [c.first for c in steps] == list(range(1, buggy.run.steps + 1))  # every update
    head = [c.values[2] for c in steps]
    backbone = [c.values[0] for c in steps]
    # the head's gradient accumulates: its last updates apply several times its first ones,
    # while the cleared backbone stays level
    assert sum(head[-5:]) / 5 > 3 * sum(head[:5]) / 5
    assert sum(backbone[-5:]) / 5 < 2 * sum(backbone[:5]) / 5
    assert heat.epoch_ends == [16, 32]
    assert all(c.lrs == [pytest.approx(1e-3)] for c in steps)


def test_no_picture_asked_records_nothing_more(tmp_path):
    report = run_check(CheckOptions(target=BUGGY, steps=3, epoch_batches=3))
    assert not report.analysis.by_kind.get("grad_flow")
    (heat,) = report.analysis.heatmaps  # still drawn, from the norms the steps measured
    assert heat.source == "trace"


def _trace_with_grad_flow(columns, bands=()):
    t = TraceBuilder()
    t.param(0, "net.fc1.weight")
    t.param(1, "net.fc1.bias")
    t.param(2, "net.fc2.weight")
    t.param(3, "head.weight")
    t.optimizer(0, [0, 1, 2, 3])
    last = max([c[0] for c in columns] + [b[1] for b in bands])
    for _ in range(last):
        t.backward(fresh=[0, 1, 2])
        t.step(0)
    t.put(ev.grad_flow(opt=0, columns=[list(c) for c in columns], bands=[list(b) for b in bands]))
    return Analysis(t.trace)


def test_layers_combine_their_parameters_and_mark_no_grad_zero_and_nonfinite():
    a = _trace_with_grad_flow([(1, [0, 1, 2], [3.0, 4.0, 0.0], [0.1]),
                               (2, [0, 1, 2], [1.0, math.nan, 2.0], [0.1]),
                               (4, [0, 1, 2], [1.0, 1.0, 1.0], [0.05])])
    (heat,) = a.heatmaps
    assert heat.rows == ["net.fc1", "net.fc2", "head"]
    first, second, gap, fourth = heat.columns
    assert first.values[:2] == [5.0, 0.0] and first.values[2] is None  # sqrt(9+16); zero; no .grad
    assert math.isnan(second.values[0])
    assert (gap.form, gap.first, gap.last) == ("gap", 3, 3)  # step 3 left no norms: a gap, not a guess
    assert fourth.lrs == [0.05] and fourth.total == pytest.approx(math.sqrt(3))
    assert heat.cells() == 3 * 4


def test_bands_are_columns_that_say_what_they_hold():
    a = _trace_with_grad_flow([(1, [0], [1.0], [0.1]), (30, [0], [2.0], [0.1])],
                              bands=[(2, 29, 28, [0], [0.5], [1.0], [4.0], [0.1])])
    band = a.heatmaps[0].columns[1]
    assert (band.form, band.first, band.last, band.count) == ("band", 2, 29, 28)
    assert (band.low[0], band.values[0], band.high[0]) == (0.5, 1.0, 4.0)


def test_the_series_stays_bounded_and_keeps_ends_whole(monkeypatch):
    monkeypatch.setattr(recording, "HEAD", 10)
    monkeypatch.setattr(recording, "TAIL", 5)
    monkeypatch.setattr(recording, "FIRST_WIDTH", 2)
    monkeypatch.setattr(recording, "MAX_BANDS", 4)
    series = recording._Series()
    pids = (0, 1)
    for step in range(1, 201):
        norms = torch.tensor([float(step), math.nan if step == 100 else 1.0])
        series.add(recording._Column(step, pids, norms, [0.1]))
    columns, bands = series.finish()
    assert [c[0] for c in columns] == [*range(1, 11), *range(196, 201)]
    assert len(bands) <= 4 + 1
    # the bands cover the middle exactly, in order
    assert bands[0][0] == 11 and bands[-1][1] == 195
    assert all(b[1] + 1 == n[0] for b, n in zip(bands, bands[1:]))
    assert sum(b[2] for b in bands) == 195 - 10
    for first, last, count, _, low, mid, high, _ in bands:
        assert low[0] == first and high[0] == last and low[0] <= mid[0] <= high[0]
    with_nan = next(b for b in bands if b[0] <= 100 <= b[1])
    assert math.isnan(with_nan[6][1])  # a NaN in a band shows in its max


def test_norms_the_step_did_not_measure_are_taken_on_the_device():
    """Gradients vouched finite by clip_grad_norm_: the step skips its norm pass; the picture's
    watcher measures them itself (kept as a tensor until the run ends)."""
    report = run_check(CheckOptions(
        target=os.path.join(ROOT, "fixtures", "amp_clip_accum", "good_plain_clip.py"), grad_flow=True))
    (heat,) = report.analysis.heatmaps
    steps = [c for c in heat.columns if c.form == "step"]
    assert len(steps) == report.run.steps
    assert all(v is not None and v > 0 for c in steps for v in c.values)
    assert heat.clip_total  # the norm before clipping, where clip_grad_norm_ reported it


def test_the_html_page_is_self_contained_and_shows_the_finding(buggy):
    page = buggy.render("html")
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page  # reads fine without script
    refs = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert refs and all(r.startswith("#") for r in refs), refs  # no network, only in-page links
    (heat,) = buggy.analysis.heatmaps
    assert len(re.findall(r'<rect class="cell', page)) == heat.cells() == 3 * buggy.run.steps
    assert "backbone.zero_grad()  # bug: the head&#39;s gradients are never cleared" in page
    assert 'class="l hit"' in page and 'class="l rel"' in page  # the line, the related ones
    # the finding links to its step in the heatmap, the marker above that step back to it
    assert 'href="#gd-step-0-2"' in page and 'id="gd-step-0-2"' in page
    assert 'href="#gd-finding-1"' in page and 'id="gd-finding-1"' in page
    assert "zero_grad L20 (GD102)" in page  # the timeline tags the call


def test_notebook_shows_the_page(buggy):
    html = buggy._repr_html_()
    assert html.startswith('<div class="gd">') and "gd-heatmap" in html


def test_markdown_for_ci_summaries(buggy):
    text = buggy.render("markdown")
    assert "**✗ 1 error, 0 warnings, 0 info**" in text
    assert "| error | `GD102` partial-zero-grad | [`examples/buggy_train.py:20`]" \
           "(examples/buggy_train.py#L20) |" in text
    row = next(line for line in text.splitlines() if line.startswith("| error"))
    assert row.count(" | ") == 4  # pipes in the texts are escaped


def test_output_names_choose_the_format():
    assert format_for_output("report.html") == "html"
    assert format_for_output("summary.md") == "markdown"
    assert FORMATS["html"].pictures and not FORMATS["markdown"].pictures


def test_plot_draws_a_png(buggy, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the graddoctor[plots] extra")
    from graddoctor.report.plot import plot

    path = tmp_path / "flow.png"
    plot(buggy, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_the_command_line_writes_the_page_and_the_plot(tmp_path):
    from conftest import run_cli

    pytest.importorskip("matplotlib", reason="--plot needs the graddoctor[plots] extra")
    page, picture = tmp_path / "report.html", tmp_path / "flow.svg"
    result = run_cli("check", BUGGY, "--steps", "3", "--epoch-batches", "3", "-o", str(page),
                     "--plot", str(picture), cwd=ROOT)
    assert result.returncode == 1, result.stderr
    assert "<" not in result.stdout  # the page went to its file
    text = page.read_text(encoding="utf-8")
    assert 'class="gd-heatmap"' in text and "partial-zero-grad" in text
    assert picture.read_text(encoding="utf-8").lstrip().startswith("<?xml")
    assert f"drew {picture}" in result.stderr


def test_the_page_on_stdout_keeps_the_script_prints_out(tmp_path):
    from conftest import run_cli

    result = run_cli("check", BUGGY, "--steps", "2", "--epoch-batches", "2", "--format", "html",
                     cwd=ROOT)
    assert result.stdout.startswith("<!DOCTYPE html>") and "epoch 0: loss" not in result.stdout
    assert "epoch 0: loss" in result.stderr


def test_plot_wants_a_picture_file():
    from conftest import run_cli

    result = run_cli("check", BUGGY, "--plot", "flow.txt", cwd=ROOT)
    assert result.returncode == 2
    assert "--plot flow.txt: the file must end in .png, .svg, .pdf" in result.stderr


def test_the_modes_of_the_layers_show_where_a_mode_rule_found_something():
    """An eval() never undone: the dropout layer's strip turns from train to eval at the epoch
    end where the validation pass left it."""
    report = run_check(CheckOptions(
        target=os.path.join(ROOT, "fixtures", "modes", "bad_train_in_eval_validation_loader.py"),
        grad_flow=True))
    (heat,) = report.analysis.heatmaps
    modes = heat.modes["model.2"]
    assert modes[1] == "train" and modes[report.run.steps] == "eval"
    page = report.render("html")
    assert ">mode model.2</text>" in page and "its forwards ran in eval mode" in page


def _drawn_figure(report, tmp_path, monkeypatch):
    """The figure --plot saves (caught at its savefig), drawn, with its renderer."""
    pytest.importorskip("matplotlib", reason="--plot needs the graddoctor[plots] extra")
    import matplotlib.figure

    from graddoctor.report.plot import plot

    caught = []
    original = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        caught.append(fig)
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    plot(report, str(tmp_path / "flow.png"))
    (fig,) = caught
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # (plot closed the figure)
    canvas.draw()
    return fig, canvas.get_renderer()


def _overlaps(a, b, pad: float = 1.0) -> bool:
    return a.x0 < b.x1 - pad and b.x0 < a.x1 - pad and a.y0 < b.y1 - pad and b.y0 < a.y1 - pad


def test_plot_has_no_overlapping_ticks_a_legend_off_the_bars_and_a_title(buggy, tmp_path, monkeypatch):
    fig, renderer = _drawn_figure(buggy, tmp_path, monkeypatch)
    for ax in fig.axes:
        for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            boxes = [t.get_window_extent(renderer) for t in labels if t.get_visible() and t.get_text()]
            for i, a in enumerate(boxes):
                for b in boxes[i + 1:]:
                    assert not _overlaps(a, b), f"tick labels overlap on {ax.get_title()!r}"
        legend = ax.get_legend()
        if legend is not None:
            box = legend.get_window_extent(renderer)
            for bar in ax.patches:
                assert not _overlaps(box, bar.get_window_extent(renderer)), "the legend covers a bar"
    title = fig._suptitle.get_text() if fig._suptitle is not None else ""
    assert "examples/buggy_train.py" in title and "GD102 partial-zero-grad" in title, title
