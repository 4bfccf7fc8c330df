"""The update timeline in the terminal: each distinct shape of an update, once, with the calls
that findings point at highlighted (and tagged with the rule code, so it reads without color)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ..findings import Finding
from .text_findings import STYLE
from .timeline import Item, Shape, main_path, shapes, step_ranges

MAX_SHAPES = 6
MAX_ITEMS = 16  # a very long update is cut in the middle


def _flagged(findings: list[Finding]) -> dict[tuple[str, int], list[Finding]]:
    out: dict[tuple[str, int], list[Finding]] = {}
    for f in findings:
        if f.location is not None and not f.suppressed:
            out.setdefault((f.location.path, f.location.line), []).append(f)
    return out


def _item_text(item: Item, home: str | None, flagged: dict) -> Text:
    if item.group:
        text = Text("(")
        for n, member in enumerate(item.group):
            if n:
                text.append(" → ", style="dim")
            text.append(_item_text(member, home, flagged))
        return text.append(f") ×{item.count}")
    plain = item.plain(home)
    hits = flagged.get((item.loc.path, item.loc.line))
    if not hits:
        return Text(plain)
    worst = max(hits, key=lambda f: f.severity.rank)
    codes = ", ".join(dict.fromkeys(f.code for f in hits))
    return Text(f"{plain} ({codes})", style=f"{STYLE[worst.severity.value]} reverse")


def shape_text(shape: Shape, home: str | None, flagged: dict) -> Text:
    items = shape.items
    if len(items) > MAX_ITEMS:
        half = MAX_ITEMS // 2
        items = [*items[:half], None, *items[-half:]]
    text = Text()
    for n, item in enumerate(items):
        if n:
            text.append(" → ", style="dim")
        text.append("…" if item is None else _item_text(item, home, flagged))
    return text


def timeline_table(analysis, findings: list[Finding]) -> Table | None:
    """None when the replay had no complete update."""
    if analysis is None:
        return None
    found = shapes(analysis)
    if not found:
        return None
    home = main_path(analysis)
    flagged = _flagged(findings)
    table = Table(box=None, show_header=True, header_style="dim", padding=(0, 1), pad_edge=False)
    table.add_column("seen", justify="right", no_wrap=True)
    table.add_column("steps", no_wrap=True)
    table.add_column(f"order of calls ({home})" if home else "order of calls", overflow="fold")
    for shape in found[:MAX_SHAPES]:
        table.add_row(f"{shape.updates}×", step_ranges(shape.steps) or "—",
                      shape_text(shape, home, flagged))
    if len(found) > MAX_SHAPES:
        rest = found[MAX_SHAPES:]
        table.add_row("", "", Text(f"… {len(rest)} more shapes ({sum(s.updates for s in rest)} updates)",
                                   style="dim"))
    return table
