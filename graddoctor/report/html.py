"""The HTML report (``--format html``, ``-o report.html``): one self-contained page — inline CSS
and SVG, no script, no network — to open in any browser or attach to a CI run.

It holds what the terminal report holds (header, verdict, findings with their source lines,
the related lines marked, the fix and its framework variants, the update timeline) and the
pictures: the gradient-flow heatmap of every update with its per-step lines (report/svg.py).
A finding links to the step where it was first seen, and the heatmap's marker above that step
links back. ``fragment(report)`` is the page's body with its styles scoped under ``.gd`` (what
a notebook shows: ``Report._repr_html_``).
"""

from __future__ import annotations

import linecache
import os
from functools import lru_cache
from pathlib import Path

from ..findings import Finding
from ..notebook import cell_of, describe, is_notebook, python_lines
from ..version import __version__
from .model import Report

CONTEXT_BEFORE, CONTEXT_AFTER = 2, 1
MAX_TIMELINE = 12


@lru_cache(maxsize=1)
def _template():
    import jinja2

    env = jinja2.Environment(autoescape=True, trim_blocks=False, lstrip_blocks=False,
                             undefined=jinja2.StrictUndefined)
    text = (Path(__file__).parent / "templates" / "report.html.j2").read_text(encoding="utf-8")
    return env.from_string(text)


def _lines(path: str, base_dir: str | None) -> tuple[list[str], bool]:
    full = path if os.path.isabs(path) else os.path.join(base_dir or os.getcwd(), path)
    if is_notebook(full):
        return [line.rstrip("\n") for line in (python_lines(full) or [])], True
    return [line.rstrip("\n") for line in linecache.getlines(full)], False


def source(path: str, line: int, base_dir: str | None, marked: dict[int, str],
           before: int = CONTEXT_BEFORE, after: int = CONTEXT_AFTER) -> list[tuple[str, str, str]]:
    """[(number as shown, text, css class)] around ``line``; ``marked``: line -> class."""
    lines, notebook = _lines(path, base_dir)
    if not lines or line > len(lines):
        return []
    out = []
    for n in range(max(1, line - before), min(len(lines), line + after) + 1):
        shown = str(n)
        if notebook:
            here = cell_of(path if os.path.isabs(path) else os.path.join(base_dir or os.getcwd(), path), n)
            if here is None:
                continue
            shown = f"c{here[0]}:{here[1]}"
        out.append((shown, lines[n - 1], marked.get(n, "")))
    return out


def _anchor(i: int) -> str:
    return f"gd-finding-{i + 1}"


def _finding(f: Finding, i: int, report: Report, step_link) -> dict:
    from .merge import seen_on

    loc = f.location
    related = []
    marked = {loc.line: "hit"} if loc else {}
    near = set()
    for r in f.related:
        rl = r.location
        same = loc is not None and rl.path == loc.path
        if same and loc.line - CONTEXT_BEFORE - 3 <= rl.line <= loc.line + CONTEXT_AFTER + 3:
            marked[rl.line] = "rel"
            near.add(rl.line)
        related.append({"where": describe(rl.path, rl.line), "note": r.note, "line": rl.line,
                        "path": rl.path, "near": same and rl.line in near})
    src = []
    if loc is not None:
        lines = sorted(near | {loc.line})
        src = source(loc.path, loc.line, report.base_dir, marked,
                     before=max(CONTEXT_BEFORE, loc.line - lines[0]),
                     after=max(CONTEXT_AFTER, lines[-1] - loc.line))
    for r in related:
        r["source"] = [] if r.pop("near") else source(r.pop("path"), r["line"], report.base_dir,
                                                      {r["line"]: "rel"}, 0, 0)
        r.pop("path", None)
    from ..frameworks import TITLES

    variants = [(f"in {TITLES.get(name, name)}", text) for name, text in (f.fixes or {}).items()
                if text and text != f.fix]
    return {"anchor": _anchor(i), "severity": f.severity.value, "code": f.code, "rule": f.rule,
            "autofix": _autofix(f, report.base_dir),
            "where": describe(loc.path, loc.line) if loc else "(no location in the code)",
            "seen_on": seen_on(f), "message": f.message, "source": src, "related": related,
            "fix": f.fix, "variants": variants, "step": f.step,
            "step_link": step_link(f.step) if f.step else None}


def _autofix(f: Finding, base_dir: str | None) -> dict | None:
    """The finding's automatic fix as the text report offers it: its safety, its verification
    and, where it has edits, the change as a diff of the file (lines with a css class)."""
    auto = f.autofix
    if auto is None or not (auto.edits or auto.refused):
        return None
    if not auto.edits:
        return {"state": "none", "safety": "", "verification": "", "title": auto.refused,
                "note": "", "diff": []}
    if auto.verification is not None and not auto.verified:  # the re-run refuted it
        why = auto.verification + (f": {auto.verification_note}" if auto.verification_note else "")
        return {"state": "refuted", "safety": auto.safety.value, "verification": why,
                "title": f"the edit ({auto.title}) failed its check; not offered", "note": "",
                "diff": []}
    verification = "verified by running the fixed script" if auto.verified else \
        "not verified yet (graddoctor check --diff runs the fixed script)"
    return {"state": "offered", "safety": auto.safety.value, "verification": verification,
            "title": auto.title, "note": auto.verification_note, "diff": _diff_lines(auto, base_dir)}


def _diff_lines(auto, base_dir: str | None) -> list[tuple[str, str]]:
    from ..edits import apply_edits, unified_diff

    out = []
    try:
        for path in dict.fromkeys(e.path for e in auto.edits):
            full = path if os.path.isabs(path) else os.path.join(base_dir or os.getcwd(), path)
            if is_notebook(full):
                continue
            with open(full, encoding="utf-8") as fh:
                old = fh.read()
            new = apply_edits(old, [e for e in auto.edits if e.path == path])
            for line in unified_diff(path, old, new).splitlines():
                cls = "hunk" if line.startswith("@@") else "file" if line.startswith(("---", "+++")) \
                    else "add" if line.startswith("+") else "del" if line.startswith("-") else ""
                out.append((cls, line))
    except (OSError, UnicodeDecodeError, ValueError, IndexError):
        return []
    return out


def _timeline(report: Report, anchors: dict) -> tuple[list[dict], str | None]:
    from .timeline import main_path, shapes, step_ranges

    a = report.analysis
    if a is None:
        return [], None
    found = shapes(a)
    home = main_path(a)
    rows = []

    def items_of(items) -> list[dict]:
        out = []
        for item in items:
            if item.group:
                out.append({"text": item.plain(home), "flag": None})
                continue
            hits = anchors.get((item.loc.path, item.loc.line))
            text = item.plain(home)
            if hits:
                worst = max(hits, key=lambda h: h[0].severity.rank)
                codes = ", ".join(dict.fromkeys(h[0].code for h in hits))
                out.append({"text": f"{text} ({codes})", "flag": worst[0].severity.value,
                            "anchor": worst[1]})
            else:
                out.append({"text": text, "flag": None})
        return out

    for shape in found[:MAX_TIMELINE]:
        rows.append({"seen": f"{shape.updates}×", "steps": step_ranges(shape.steps) or "—",
                     "items": items_of(shape.items)})
    if len(found) > MAX_TIMELINE:
        rest = found[MAX_TIMELINE:]
        rows.append({"seen": "", "steps": "", "items": [
            {"text": f"… {len(rest)} more shapes ({sum(s.updates for s in rest)} updates)", "flag": None}]})
    return rows, home


def context(report: Report) -> dict:
    """Everything the page shows, as plain values (tests read it too)."""
    from markupsafe import Markup

    from .svg import heatmap_svg, legend_svg, lines_svg
    from .text import STATUS_TEXT, header_facts, ranks_line, verdict

    run = report.run
    heatmaps = []
    try:
        heats = report.analysis.heatmaps if report.analysis is not None else []
    except Exception as exc:  # a picture must never cost the report
        heats = []
        report = _with_error(report, "drawing the gradient flow", exc)
    column_of = {}
    for h in heats:
        for c in h.columns:
            if c.form != "gap":
                for s in (c.first,):
                    column_of.setdefault(s, f"gd-step-{h.opt}-{c.first}")

    def step_link(step):
        return column_of.get(step)

    active = report.active()
    findings = [_finding(f, i, report, step_link) for i, f in enumerate(active)]
    anchors: dict = {}
    for i, f in enumerate(active):
        if f.location is not None:
            anchors.setdefault((f.location.path, f.location.line), []).append((f, _anchor(i)))
    finding_steps: dict[int, list] = {}
    for i, f in enumerate(active):
        if f.step:
            finding_steps.setdefault(f.step, []).append((f.code, _anchor(i)))
    from ..rules import ALL_RULES

    mode_rules = {r.slug for r in ALL_RULES if r.code.startswith("GD3")}  # the train/eval rules
    show_modes = any(f.rule in mode_rules for f in active)
    for h in heats:
        title = h.optimizer
        if run.ranks:
            title += " · rank 0" if any(e.get("rank") == 0 for e in run.ranks) else ""
        heatmaps.append({"title": title, "svg": Markup(heatmap_svg(h, finding_steps, show_modes)),
                         "legend": Markup(legend_svg(h)),
                         "lines": Markup(lines_svg(h) or "")})
    timeline, home = _timeline(report, anchors)
    v = verdict(report)
    code = report.exit_code()
    verdict_class = "v-fail" if code else ("v-ok" if v.plain.startswith("✓") else "v-warn")
    error_at = ""
    if run.error and run.error.get("location"):
        loc = run.error["location"]
        error_at = f" at {describe(loc.get('path'), loc.get('line'))}"
    return {
        "run": run, "facts": header_facts(report), "status_text": STATUS_TEXT.get(run.status, str(run.status)),
        "ranks_line": ranks_line(run) if run.ranks else "", "error_at": error_at,
        "verdict": v.plain, "verdict_class": verdict_class, "findings": findings,
        "suppressed": [{"severity": f.severity.value, "code": f.code, "rule": f.rule,
                        "where": describe(f.location.path, f.location.line) if f.location else ""}
                       for f in report.suppressed()],
        "internal_errors": report.internal_errors, "heatmaps": heatmaps,
        "heat_source": heats[0].source if heats else "", "timeline": timeline, "home": home,
        "version": __version__
    }


def _with_error(report: Report, where: str, exc: Exception) -> Report:
    import dataclasses

    return dataclasses.replace(report, internal_errors=[
        *report.internal_errors, {"where": where, "error": f"{type(exc).__name__}: {exc}"}])


def fragment(report: Report) -> str:
    """The report as an HTML fragment (styles scoped under ``.gd``): a notebook's view."""
    return _template().render(**context(report))


def render(report: Report) -> str:
    title = f"graddoctor · {report.run.script}"
    from html import escape

    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title></head><body style=\"margin:0;background:#fff\">\n"
            f"{fragment(report)}\n</body></html>\n")
