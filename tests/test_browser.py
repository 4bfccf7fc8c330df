"""The HTML report in a real browser: headless Chromium (Debian's ``chromium``; ``.ci/run``
installs it) loads the page of a few runs once each, takes a screenshot and reports what it
shows. Checked: no console error, one heatmap cell per (row, update) shown, the finding's source
line on the page, a screenshot that is not blank.

``GRADDOCTOR_SCREENSHOTS=docs/pictures`` keeps the screenshots there (the README shows one).
"""

from __future__ import annotations

import functools
import os
import shutil

import pytest

from browser import find_chromium, load, png_pixels
from graddoctor.options import CheckOptions
from graddoctor.report.merge import Part, merge
from graddoctor.run.session import run_check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium found (apt-get install chromium, or set "
    "GRADDOCTOR_CHROMIUM): the HTML report's browser tests need one; .ci/run installs it")


def _check(path: str, **options):
    return run_check(CheckOptions(target=path, grad_flow=True, **options))


def _merged_two_ranks():
    """A report merged from two ranks' parts (as rank 0 merges what the ranks send): the same
    loop on both, so its finding is seen on ranks 0–1."""
    report = _check("fixtures/zero_grad/bad_missing_zero_grad_basic.py")
    return merge([Part(report, 0, "rank 0", 101), Part(report, 1, "rank 1", 102)], world_size=2,
                 fail_on=report.fail_on)


# name -> (how to get the report, window height, a line the page must show)
PAGES = {
    "buggy_train": (lambda: _check("examples/buggy_train.py"), 1300,
                    "backbone.zero_grad()  # bug: the head's gradients are never cleared"),
    "missing_zero_grad": (lambda: _check("fixtures/zero_grad/bad_missing_zero_grad_basic.py"),
                          1250, "loss.backward()  # expect: missing-zero-grad"),
    "clean_run": (lambda: _check("fixtures/amp_clip_accum/good_plain_clip.py"), 1000,
                  "no gradient bugs found"),
    "accumulation": (lambda: _check("fixtures/amp_clip_accum/good_clip_at_boundary.py"), 1000,
                     "no gradient bugs found"),
    "folded_2000_steps": (lambda: _check("tests/scripts/long_run_2000.py", steps=0), 900,
                          "1760 updates folded into"),
    "merged_2_ranks": (_merged_two_ranks, 1250, "seen on rank 0–1"),
}


@functools.cache
def page_report(name: str):
    """The report of a page, made once per test process (from the repository, as the paths the
    page shows are relative to it): the two tests of a page read the same frozen report, so the
    2,000-step run is made once, not once per test."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        return PAGES[name][0]()


@pytest.mark.parametrize("name", list(PAGES))
def test_the_page_in_a_browser(name, tmp_path, monkeypatch):
    _, height, expected = PAGES[name]
    monkeypatch.chdir(ROOT)  # the paths the page shows: relative to the repository
    report = page_report(name)
    html = tmp_path / f"{name}.html"
    html.write_text(report.render("html"), encoding="utf-8")
    png = tmp_path / f"{name}.png"
    probe, console = load(CHROMIUM, str(html), str(png), str(tmp_path / "profile"), height=height)
    assert not console, "console errors:\n" + "\n".join(console)
    assert probe is not None, "the page never finished loading"
    # one cell per (row, update shown); the page draws exactly what the analysis holds
    heats = report.analysis.heatmaps
    assert len(probe["maps"]) == len(heats) >= 1
    for shown, heat in zip(probe["maps"], heats):
        assert shown["cells"] == shown["declared"] == heat.cells()
        assert shown["rows"] == len(heat.rows) and shown["columns"] == len(heat.columns)
        assert shown["gaps"] == sum(1 for c in heat.columns if c.form == "gap")
        assert shown["width"] > 300 and shown["height"] > 40
    assert expected in probe["text"]
    for f in report.active():  # each finding's source line
        line = open(f.location.path if os.path.isabs(f.location.path)
                    else os.path.join(report.base_dir or os.getcwd(), f.location.path)
                    ).read().splitlines()[f.location.line - 1].strip()
        assert line in probe["text"]
    # the screenshot is drawn: many colours, and the heatmap's dark and bright cells
    width, _, pixels = png_pixels(str(png))
    assert width == 1400
    colours = set(pixels)
    assert len(colours) > 200, "the screenshot looks blank"
    white = sum(1 for p in pixels if min(p) > 245)
    assert white < 0.97 * len(pixels)
    keep = os.environ.get("GRADDOCTOR_SCREENSHOTS")
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(png, os.path.join(keep, f"{name}.png"))


@pytest.mark.parametrize("name", ["buggy_train", "folded_2000_steps"])
def test_the_page_fits_800_pixels(name, tmp_path, monkeypatch):
    """At 800 px the whole heatmap (its last updates, where an accumulating bug is brightest),
    the trend column and the per-step lines' axis are on screen: nothing scrolls sideways."""
    _, height, _ = PAGES[name]
    monkeypatch.chdir(ROOT)
    report = page_report(name)
    html = tmp_path / f"{name}.html"
    html.write_text(report.render("html"), encoding="utf-8")
    png = tmp_path / f"{name}_800.png"
    probe, console = load(CHROMIUM, str(html), str(png), str(tmp_path / "profile"), width=800,
                          height=height)
    assert not console and probe is not None, console
    assert probe["scrollWidth"] <= probe["innerWidth"], (probe["scrollWidth"], probe["innerWidth"])
    for svg in probe["svgs"]:
        assert svg["right"] <= probe["innerWidth"], svg
    assert len(probe["ticks"]) >= 3, probe["ticks"]  # the colour scale is labelled, not just its ends
    if name == "buggy_train":  # the autofix, as a diff with its safety and verification
        text = probe["text"]
        assert "autofix" in text and "safe" in text and "not verified yet" in text
        assert "-        backbone.zero_grad()" in text and "+        optimizer.zero_grad()" in text
