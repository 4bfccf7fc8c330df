"""The report formats behind one interface, and the registry the CLI dispatches through.

A format (text, json, sarif, github, html, markdown) has a ``name`` (``--format NAME``), a ``summary`` (for the option's help),
``machine`` (a document for programs: strict JSON), ``document`` (while it goes to stdout, the
script's own prints are sent to stderr), ``pictures`` (it needs every update's gradient norms
recorded) and ``render(report, options) -> str``. It sees only the ``Report``
(report/model.py) and the ``RenderOptions``; it never decides anything.

Kept light: a format imports its renderer when it renders (``--help`` stays instant and no
format pulls in torch).
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from typing import ClassVar

from .model import Report


@dataclass(frozen=True)
class RenderOptions:
    to_terminal: bool = False  # the report goes to stdout (colour and width follow the terminal)
    grad_flow: bool = False  # text: the per-layer gradient norms of the last update
    quiet: bool = False  # text: only the findings and the verdict


class ReportFormat:
    name: ClassVar[str]
    summary: ClassVar[str] = ""
    machine: ClassVar[bool] = True
    # one document on stdout (JSON, SARIF, a page, a summary): the script's own prints go to
    # stderr while it does, so they cannot break it
    document: ClassVar[bool] = True
    pictures: ClassVar[bool] = False  # needs every update's gradient norms recorded

    def render(self, report: "Report", options: RenderOptions = RenderOptions()) -> str:
        raise NotImplementedError


class TextFormat(ReportFormat):
    """The terminal view (report/text.py): coloured and fitted to the terminal when it goes to
    one, plain otherwise."""

    name = "text"
    summary = "terminal"
    machine = False
    document = False

    def render(self, report, options=RenderOptions()):
        from .text import render, wants_color

        color = options.to_terminal and wants_color(sys.stdout)
        width = shutil.get_terminal_size((100, 24)).columns if options.to_terminal else None
        return render(report, width=width, color=color, grad_flow=options.grad_flow,
                      quiet=options.quiet)


class JsonFormat(ReportFormat):
    """The JSON report (report/json_format.py, with its JSON Schema)."""

    name = "json"

    def render(self, report, options=RenderOptions()):
        from .json_format import render

        return render(report)


class SarifFormat(ReportFormat):
    """SARIF 2.1.0 for code scanning (report/sarif.py)."""

    name = "sarif"
    summary = "code scanning"

    def render(self, report, options=RenderOptions()):
        from .sarif import render

        return render(report)


class GithubFormat(ReportFormat):
    """GitHub Actions workflow commands (report/github.py): an annotation on each finding's
    line of the pull request, with no code-scanning permission needed."""

    name = "github"
    summary = "GitHub Actions annotations"
    machine = False

    def render(self, report, options=RenderOptions()):
        from .github import render

        return render(report)


class HtmlFormat(ReportFormat):
    """One self-contained page with the pictures (report/html.py): the gradient-flow heatmap,
    per-step lines, findings with their source, the update timeline. Asking for it records
    every update's gradient norms (``pictures``)."""

    name = "html"
    summary = "a page with the gradient-flow heatmap"
    machine = False
    pictures = True

    def render(self, report, options=RenderOptions()):
        from .html import render

        return render(report)


class MarkdownFormat(ReportFormat):
    """A compact findings table with file:line links and the verdict (report/markdown.py): for
    a CI job summary ($GITHUB_STEP_SUMMARY) or a review comment."""

    name = "markdown"
    summary = "CI job summaries"
    machine = False

    def render(self, report, options=RenderOptions()):
        from .markdown import render

        return render(report)


FORMATS: dict[str, ReportFormat] = {f.name: f for f in (
    TextFormat(), JsonFormat(), SarifFormat(), GithubFormat(), HtmlFormat(), MarkdownFormat())}


SUFFIXES = {".sarif": "sarif", ".sarif.json": "sarif", ".json": "json", ".html": "html",
            ".htm": "html", ".md": "markdown"}
"""The format an ``--output`` file name asks for when ``--format`` is not given."""


def format_for_output(path: str) -> str | None:
    """``report.json`` -> "json", ``graddoctor.sarif`` (or ``.sarif.json``) -> "sarif",
    ``report.html`` -> "html", ``summary.md`` -> "markdown", any other name -> None (text)."""
    name = path.lower()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return SUFFIXES[suffix]
    return None


def get_format(name: str) -> ReportFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown report format {name!r} (known: {', '.join(FORMATS)})") from None


class ReportViews:
    """What ``Report.render()``, ``to_json()``, ``str()`` and ``__rich__`` do: the formats, behind
    the public methods of the model (which only data lives in)."""

    def render(self, report: Report, format: str, *, grad_flow: bool = False) -> str:
        return get_format(format).render(report, RenderOptions(grad_flow=grad_flow))

    def html(self, report: Report) -> str:
        """A notebook's view: the HTML report as a fragment (styles scoped to it)."""
        from .html import fragment

        return fragment(report)

    def to_json(self, report: Report) -> dict:
        from .json_format import to_dict

        return to_dict(report)

    def rich(self, report: Report):
        from rich.console import Group
        from rich.text import Text

        from .text import render_to

        class _Collect:  # render_to prints; keep what it prints, in order
            def __init__(self):
                self.parts = []

            def print(self, *objects, **_):
                self.parts.extend(objects or (Text(""),))

        collect = _Collect()
        render_to(collect, report)
        return Group(*collect.parts)


Report.views = ReportViews()
