"""The scale of the ``--grad-flow`` bars: where a layer's gradient norm falls on a log scale.
The norms themselves come from the analysis (analysis/gradflow.py). No torch, no rich."""

from __future__ import annotations

import math

from ..analysis.gradflow import LayerNorm, UpdateNorms, layer_of  # noqa: F401  (for the views)


def bar_fraction(norm: float | None, top: float, decades: float) -> float:
    """Where a norm falls on a log scale from ``top / 10**decades`` (0) to ``top`` (1)."""
    if norm is None or not math.isfinite(norm) or norm <= 0 or top <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 + math.log10(norm / top) / decades))


def log_span(norms: list[float | None], minimum_decades: float = 4.0) -> tuple[float, float]:
    """(top, decades): the scale covers the largest norm and at least ``minimum_decades`` below
    it, more when the smallest non-zero norm lies further down (vanishing layers stay visible)."""
    positive = [n for n in norms if n is not None and math.isfinite(n) and n > 0]
    if not positive:
        return 0.0, minimum_decades
    top, low = max(positive), min(positive)
    decades = max(minimum_decades, math.ceil(math.log10(top / low)) + 1)
    return top, float(decades)
