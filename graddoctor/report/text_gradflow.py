"""``--grad-flow``: the gradient norm of every layer in the last update, as bars on a log scale —
the picture people draw by hand to spot vanishing or exploding layers."""

from __future__ import annotations

import math

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .gradflow import LayerNorm, UpdateNorms, bar_fraction, log_span

BAR_WIDTH = 30
MAX_LAYERS = 80


def _bar(layer: LayerNorm, top: float, decades: float) -> Text:
    if layer.norm is None:
        return Text("·" * BAR_WIDTH, style="dim")
    if math.isnan(layer.norm):
        return Text("!" * BAR_WIDTH, style="bold red")
    filled = round(bar_fraction(layer.norm, top, decades) * BAR_WIDTH)
    if layer.norm > 0:
        filled = max(1, filled)
    return Text.assemble(("█" * filled, "green"), ("·" * (BAR_WIDTH - filled), "dim"))


def _value(layer: LayerNorm) -> Text:
    if layer.norm is None:
        return Text("no .grad", style="yellow")
    if math.isnan(layer.norm):
        return Text("nan/inf", style="bold red")
    text = Text(f"{layer.norm:.2e}")
    if layer.without_grad:
        text.append(f" ({layer.without_grad} without .grad)", style="yellow")
    return text


def update_view(analysis, update: UpdateNorms) -> Group:
    norms = [layer.norm for layer in update.layers]
    top, decades = log_span(norms)
    table = Table(box=None, show_header=False, padding=(0, 1), pad_edge=False)
    table.add_column("layer", overflow="fold", max_width=48)
    table.add_column("bar", no_wrap=True)
    table.add_column("norm", no_wrap=True)
    for layer in update.layers[:MAX_LAYERS]:
        table.add_row(layer.layer, _bar(layer, top, decades), _value(layer))
    parts = [Text(f"{analysis.optimizer_name(update.opt)}, step {update.step}: L2 norm of each "
                  "layer's gradient", style="bold"), table]
    if len(update.layers) > MAX_LAYERS:
        parts.append(Text(f"… {len(update.layers) - MAX_LAYERS} more layers", style="dim"))
    if top > 0:
        parts.append(Text(f"log scale: a full bar is {top:.1e}, an empty one {top / 10 ** decades:.0e} "
                          f"({decades:g} decades)", style="dim"))
    return Group(*parts)


def grad_flow_view(analysis) -> Group | None:
    """None when no optimizer step carried gradient norms (closure-only or no steps)."""
    if analysis is None:
        return None
    updates = analysis.last_update_norms
    if not updates:
        return None
    return Group(*[update_view(analysis, u) for u in updates])
