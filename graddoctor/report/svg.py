"""The pictures of the HTML report as inline SVG (no script, no network): the gradient-flow
heatmap and the per-step lines. Plain string building over the analysis' ``Heatmap``
(analysis/gradflow.py); no torch, no matplotlib.

The heatmap: one row per layer (model order, grouped by module), one column per optimizer
update; colour = log10 of the L2 norm of the layer's gradient that update applied. Distinct
marks: no ``.grad`` (grey, hatched), zero (white with a dot), NaN/Inf (red with a cross). A band
of a long run's middle updates (folded into min/median/max while recording) is drawn with its
median and white stripes; updates with nothing to show are one grey ``gap`` column that says
why. Every cell is a ``rect.cell`` with a ``<title>`` (the tooltip, no script needed).
"""

from __future__ import annotations

import math
from html import escape

from ..analysis.gradflow import HeatColumn, Heatmap

# viridis, 9 stops: dark = small gradient, yellow = large
_VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962",
            "#addc30", "#fde725"]
NO_GRAD, ZERO, NONFINITE = "#d9d9d9", "#ffffff", "#d62728"
ZERO_STROKE = ' stroke="#bbb" stroke-width="0.5"'

ROW_H = 18
GROUP_GAP = 6  # pixels between two modules' rows
STRIP_H = 14
SPARK_W = 110
HEAT_W = 940  # pixels the columns share at most
MAX_MODE_ROWS = 6
MIN_DECADES = 1.5  # the colour scale spans at least this many decades
MIN_W = 420  # ... and at least, up to 48 pixels a column


def _hex(c: str) -> tuple[int, int, int]:
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


def colour(t: float) -> str:
    """viridis at ``t`` in [0, 1]."""
    t = min(1.0, max(0.0, t)) * (len(_VIRIDIS) - 1)
    i = min(int(t), len(_VIRIDIS) - 2)
    f = t - i
    a, b = _hex(_VIRIDIS[i]), _hex(_VIRIDIS[i + 1])
    return "#%02x%02x%02x" % tuple(round(x + (y - x) * f) for x, y in zip(a, b))


def fmt(v: float | None) -> str:
    if v is None:
        return "no .grad"
    if isinstance(v, float) and math.isnan(v):
        return "NaN/Inf"
    return "0" if v == 0 else f"{v:.3g}"


def log_range(heat: Heatmap) -> tuple[float, float]:
    """(lo, hi) of log10 over every finite, positive norm in the heatmap."""
    logs = [math.log10(v) for c in heat.columns
            for values in (c.values, c.low or (), c.high or ()) for v in values
            if v is not None and math.isfinite(v) and v > 0]
    if not logs:
        return -1.0, 0.0
    lo, hi = min(logs), max(logs)
    # at least MIN_DECADES under the top: norms that wobble by a few percent stay one colour
    # (a steady run looks steady), while a gradient that climbs 5x still crosses half the scale
    return min(lo, hi - MIN_DECADES), hi


def _fill(v: float | None, lo: float, hi: float) -> tuple[str, str]:
    """(fill, mark): mark is "", "nograd", "zero" or "nonfinite"."""
    if v is None:
        return NO_GRAD, "nograd"
    if math.isnan(v) or math.isinf(v):
        return NONFINITE, "nonfinite"
    if v == 0:
        return ZERO, "zero"
    return colour((math.log10(v) - lo) / (hi - lo)), ""


def _defs() -> str:
    return ("<defs>"
            '<pattern id="gd-hatch" width="4" height="4" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(45)"><rect width="4" height="4" fill="#d9d9d9"/>'
            '<line x1="0" y1="0" x2="0" y2="4" stroke="#9a9a9a" stroke-width="1.5"/></pattern>'
            '<pattern id="gd-band" width="6" height="6" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(-45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#fff" '
            'stroke-opacity="0.55" stroke-width="1.5"/></pattern>'
            '<pattern id="gd-gap" width="6" height="6" patternUnits="userSpaceOnUse">'
            '<rect width="6" height="6" fill="#f2f2f2"/><path d="M0 6L6 0" stroke="#bbb"/></pattern>'
            "</defs>")


class _Layout:
    def __init__(self, heat: Heatmap, show_modes: bool = False):
        self.heat = heat
        n = len(heat.columns)
        # a short run gets wide cells (at least MIN_W in all), a long one narrow ones
        self.cw = min(48.0, max(3.0, min(24.0, HEAT_W / max(n, 1)), MIN_W / max(n, 1)))
        longest = max((len(r) for r in heat.rows), default=4)
        longest = max([longest] + [5 + len(name) for name in heat.modes])
        self.label_w = max(110, min(300, 16 + 7 * longest))
        # the strips above the cells: findings always, the others where they have something
        self.strips = ["findings"]
        if any(k > 1 for k in heat.micro.values()) or heat.skipped:
            self.strips.append("micro-batches" if not heat.skipped else "batches / skipped")
        # the train/eval mode of each BatchNorm/dropout layer, where it tells something: a layer
        # not always in train mode, or a run the mode rules found something in
        self.mode_rows = [name for name, steps in heat.modes.items()
                          if show_modes or any(m != "train" for m in steps.values())][:MAX_MODE_ROWS]
        self.strips += [f"mode {name}" for name in self.mode_rows]
        self.top = len(self.strips) * STRIP_H + 8
        self.row_y: list[float] = []
        y = self.top
        group_of = {}
        for module, first, count in heat.groups:
            for i in range(first, first + count):
                group_of[i] = (module, first)
        previous = None
        for i in range(len(heat.rows)):
            if previous is not None and group_of.get(i, (None, i))[1] != previous:
                y += GROUP_GAP
            previous = group_of.get(i, (None, i))[1]
            self.row_y.append(y)
            y += ROW_H
        self.bottom = y
        self.col_x = [self.label_w + i * self.cw for i in range(n)]
        self.right = self.label_w + n * self.cw

    def x_of_step(self, step: int) -> float | None:
        """The middle of the column that holds ``step``."""
        for x, c in zip(self.col_x, self.heat.columns):
            if c.first <= step <= c.last:
                return x + self.cw / 2
        return None

    def x_after_step(self, step: int) -> float | None:
        for x, c in zip(self.col_x, self.heat.columns):
            if c.first <= step <= c.last:
                return x + self.cw if step == c.last else x + self.cw / 2
        return None


def _column_title(c: HeatColumn) -> str:
    if c.form == "band":
        return f"steps {c.first}–{c.last} ({c.count} updates folded into a band)"
    if c.form == "gap":
        return f"steps {c.first}–{c.last}" if c.last > c.first else f"step {c.first}"
    return f"step {c.first}"


def heatmap_svg(heat: Heatmap, finding_steps: dict[int, list[tuple[str, str]]] | None = None,
                show_modes: bool = False) -> str:
    """The heatmap as one ``<svg>``. ``finding_steps``: step -> [(code, anchor)] of the findings
    first seen there (a marker above the column links to the finding); ``show_modes``: draw the
    train/eval mode of every BatchNorm/dropout layer (a mode rule found something)."""
    L = _Layout(heat, show_modes)
    lo, hi = log_range(heat)
    width = L.right + 16 + SPARK_W + 70
    height = L.bottom + 54
    cells = sum(1 for c in heat.columns if c.form != "gap") * len(heat.rows)
    out = [f'<svg class="gd-heatmap" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
           f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
           f'data-rows="{len(heat.rows)}" data-columns="{len(heat.columns)}" data-cells="{cells}" '
           f'font-family="system-ui, sans-serif" font-size="11">', _defs(),
           f"<title>gradient flow of {escape(heat.optimizer)}: log10 of each layer's gradient "
           f"norm at every optimizer update</title>"]
    # the strips above the cells: findings, micro-batches, modes
    for k, name in enumerate(L.strips):
        y = k * STRIP_H
        out.append(f'<text x="{L.label_w - 6}" y="{y + 11}" text-anchor="end" fill="#666">'
                   f"{escape(name)}</text>")
    for x, c in zip(L.col_x, heat.columns):
        micro = max((heat.micro.get(s, 0) for s in range(c.first, min(c.last, c.first + 50) + 1)),
                    default=0) if c.form != "gap" else 0
        if micro > 1:
            shade = min(0.85, 0.25 + 0.08 * micro)
            out.append(f'<rect class="gd-micro" x="{x:.1f}" y="{STRIP_H + 1}" width="{L.cw:.1f}" height="{STRIP_H - 2}" '
                       f'fill="#1f77b4" fill-opacity="{shade:.2f}"><title>{_column_title(c)}: '
                       f"{micro} backward calls applied by one update (accumulation)</title></rect>")
            if L.cw >= 10:
                out.append(f'<text x="{x + L.cw / 2:.1f}" y="{STRIP_H + 11}" text-anchor="middle" '
                           f'fill="#fff" font-size="9">{micro}</text>')
        skipped = [s for s in heat.skipped if c.first <= s <= c.last]
        if skipped:
            out.append(f'<rect x="{x:.1f}" y="{STRIP_H + 1}" width="{L.cw:.1f}" height="{STRIP_H - 2}" '
                       f'fill="#d62728"><title>{_column_title(c)}: {len(skipped)} update(s) skipped '
                       f"by the GradScaler</title></rect>")
        for name in L.mode_rows:
            steps = heat.modes[name]
            modes = {steps[s] for s in range(c.first, c.last + 1) if s in steps} \
                if c.last - c.first < 5000 else set()
            if not modes:
                continue
            mode = modes.pop() if len(modes) == 1 else "mixed"
            fill = {"train": "#2ca02c", "eval": "#ff7f0e", "mixed": "#9467bd"}[mode]
            out.append(f'<rect class="gd-mode" x="{x:.1f}" y="{L.strips.index("mode " + name) * STRIP_H + 1}" '
                       f'width="{L.cw:.1f}" height="{STRIP_H - 2}" fill="{fill}" fill-opacity="0.7">'
                       f"<title>{escape(name)} · {_column_title(c)}: its forwards ran in {mode} mode"
                       f"</title></rect>")
    for step, marks in sorted((finding_steps or {}).items()):
        x = L.x_of_step(step)
        if x is None:
            continue
        codes = ", ".join(code for code, _ in marks)
        out.append(f'<a href="#{marks[0][1]}"><path class="gd-finding-mark" d="M{x - 5:.1f} 1 '
                   f'L{x + 5:.1f} 1 L{x:.1f} {STRIP_H - 2}Z" fill="#d62728"><title>{escape(codes)} '
                   f"first seen at step {step}: see the finding</title></path></a>")
    # row labels and module groups
    for module, first, count in heat.groups:
        y0, y1 = L.row_y[first], L.row_y[first + count - 1] + ROW_H
        out.append(f'<line x1="2" y1="{y0 + 1}" x2="2" y2="{y1 - 1}" stroke="#888" stroke-width="2">'
                   f"<title>{escape(module)}</title></line>")
    for i, row in enumerate(heat.rows):
        out.append(f'<text x="{L.label_w - 6}" y="{L.row_y[i] + 13}" text-anchor="end">'
                   f"{escape(row)}</text>")
    # the cells
    for x, c in zip(L.col_x, heat.columns):
        title = _column_title(c)
        if c.form == "gap":
            out.append(f'<rect class="gd-gap" x="{x:.1f}" y="{L.top}" width="{L.cw:.1f}" '
                       f'height="{L.bottom - L.top}" fill="url(#gd-gap)" stroke="#999" '
                       f'stroke-width="0.5"><title>{title}: {escape(c.why)}</title></rect>')
            continue
        out.append(f'<g id="gd-step-{heat.opt}-{c.first}">')
        for i, v in enumerate(c.values):
            fill, mark = _fill(v, lo, hi)
            y = L.row_y[i]
            tip = f"{escape(heat.rows[i])} · {title}: "
            if c.form == "band":
                tip += (f"median {fmt(v)}, min {fmt(c.low[i] if c.low else None)}, "
                        f"max {fmt(c.high[i] if c.high else None)}")
            else:
                tip += f"gradient norm {fmt(v)}"
            paint = "url(#gd-hatch)" if mark == "nograd" else fill
            out.append(f'<rect class="cell{" band" if c.form == "band" else ""}{" " + mark if mark else ""}" '
                       f'data-step="{c.first}" data-row="{i}" x="{x:.1f}" y="{y}" '
                       f'width="{L.cw:.2f}" height="{ROW_H - 1}" fill="{paint}"'
                       f'{ZERO_STROKE if mark == "zero" else ""}>'
                       f"<title>{tip}</title></rect>")
            if mark == "zero" and L.cw >= 5:
                out.append(f'<circle cx="{x + L.cw / 2:.1f}" cy="{y + ROW_H / 2 - 0.5:.1f}" r="1.6" '
                           f'fill="#333"/>')
            elif mark == "nonfinite" and L.cw >= 5:
                out.append(f'<path d="M{x + 1:.1f} {y + 1} L{x + L.cw - 1:.1f} {y + ROW_H - 2} '
                           f'M{x + L.cw - 1:.1f} {y + 1} L{x + 1:.1f} {y + ROW_H - 2}" stroke="#fff" '
                           f'stroke-width="1.2"/>')
            if c.form == "band":
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{L.cw:.2f}" height="{ROW_H - 1}" '
                           f'fill="url(#gd-band)" pointer-events="none"/>')
        out.append("</g>")
    # epoch ends: a dashed line after the update that ended the epoch
    for step in heat.epoch_ends:
        x = L.x_after_step(step)
        if x is None:
            continue
        out.append(f'<line class="gd-epoch" x1="{x:.1f}" y1="{STRIP_H}" x2="{x:.1f}" '
                   f'y2="{L.bottom + 4}" stroke="#222" stroke-width="1.5" stroke-dasharray="3 2">'
                   f"<title>an epoch ended after step {step}</title></line>")
    # the step axis: labels at evenly spaced columns (a band's column holds many steps, so the
    # axis is not linear where bands are; they are bracketed and say so)
    n = len(heat.columns)
    label_every = max(1, math.ceil(n / max(1, (L.right - L.label_w) / 46)))
    for j, (x, c) in enumerate(zip(L.col_x, heat.columns)):
        if j % label_every == 0 or j == n - 1:
            if j == n - 1 and j % label_every and (j % label_every) < label_every / 2:
                continue  # too close to the previous label
            out.append(f'<text x="{x + L.cw / 2:.1f}" y="{L.bottom + 14}" text-anchor="middle" '
                       f'fill="#444">{c.first}</text>')
    runs: list[list[int]] = []  # consecutive band (or gap) columns
    for j, c in enumerate(heat.columns):
        if c.form != "step":
            if runs and runs[-1][1] == j - 1:
                runs[-1][1] = j
            else:
                runs.append([j, j])
    for j0, j1 in runs:
        cols = heat.columns[j0:j1 + 1]
        x0, x1 = L.col_x[j0], L.col_x[j1] + L.cw
        updates = sum(c.count for c in cols)
        bands = sum(1 for c in cols if c.form == "band")
        plural = "s" if updates != 1 else ""
        if bands:
            what = f"{updates} updates folded into {bands} bands (min/median/max kept)"
        elif all(c.why.startswith("skipped") for c in cols):
            what = f"{updates} update{plural} skipped by the GradScaler"
        else:
            what = f"{updates} update{plural} not recorded"
        out.append(f'<path class="gd-bracket" d="M{x0:.1f} {L.bottom + 18} v4 H{x1:.1f} v-4" '
                   f'fill="none" stroke="#777"/><text x="{(x0 + x1) / 2:.1f}" y="{L.bottom + 32}" '
                   f'text-anchor="middle" fill="#555" font-size="10">{what}</text>')
    out.append(f'<text x="{L.label_w}" y="{L.bottom + 46}" fill="#666">optimizer step →</text>')
    # per-row trend: how each layer's norm moves over the updates (a climbing line is the
    # signature of gradients that nothing clears)
    sx = L.right + 16
    out.append(f'<text x="{sx}" y="{L.top - 4}" fill="#666">trend (log)</text>')
    for i in range(len(heat.rows)):
        points = []
        for x, c in zip(L.col_x, heat.columns):
            v = c.values[i] if c.form != "gap" else None
            if v is not None and math.isfinite(v) and v > 0:
                t = (math.log10(v) - lo) / (hi - lo)
                px = sx + (x - L.label_w + L.cw / 2) / max(L.right - L.label_w, 1) * SPARK_W
                points.append(f"{px:.1f},{L.row_y[i] + ROW_H - 3 - t * (ROW_H - 5):.1f}")
        if len(points) > 1:
            out.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="#3b528b" '
                       f'stroke-width="1.2"/>')
    out.append("</svg>")
    return "".join(out)


def legend_ticks(lo: float, hi: float, width: float, min_gap: float = 44) -> list[tuple[float, str]]:
    """[(x, label)] along a colour bar of ``width`` pixels over log10 values lo..hi: every decade
    inside the range (thinned so that labels keep ``min_gap`` apart), else evenly spaced values;
    always both ends."""
    span = max(hi - lo, 1e-12)
    ticks = [(0, lo), (0, hi)]  # (priority, log10 value): the ends, the decades, then 2x and 5x
    for d in range(math.floor(lo), math.ceil(hi) + 1):
        for priority, m in ((1, 1), (2, 5), (3, 2)):
            v = d + math.log10(m)
            if lo < v < hi:
                ticks.append((priority, v))
    placed: list[tuple[float, str]] = []
    for _, v in sorted(ticks):
        label = f"{10 ** v:.2g}"
        x = (v - lo) / span * width
        if all(abs(x - px) >= min_gap for px, _ in placed):
            placed.append((x, label))
    return sorted(placed)


def legend_svg(heat: Heatmap) -> str:
    """The colour scale with labelled ticks (every decade), then the marks' meanings."""
    lo, hi = log_range(heat)
    w, x0 = 300, 4
    out = ['<svg class="gd-legend" xmlns="http://www.w3.org/2000/svg" width="720" height="48" '
           'viewBox="0 0 720 48" font-family="system-ui, sans-serif" font-size="11">', _defs(),
           f'<text x="{x0}" y="10" fill="#444">colour: L2 norm of the layer\'s gradient an update '
           f'applied (log scale)</text>']
    for k in range(44):
        out.append(f'<rect x="{x0 + k * w / 44:.1f}" y="15" width="{w / 44 + 0.6:.1f}" height="12" '
                   f'fill="{colour(k / 43)}"/>')
    for x, label in legend_ticks(lo, hi, w):
        anchor = "start" if x < 1 else "end" if x > w - 1 else "middle"
        out.append(f'<line class="gd-tick" x1="{x0 + x:.1f}" y1="27" x2="{x0 + x:.1f}" y2="31" stroke="#444"/>'
                   f'<text class="gd-tick-label" x="{x0 + x:.1f}" y="43" text-anchor="{anchor}">{label}</text>')
    x = x0 + w + 24
    for fill, label, extra in (("url(#gd-hatch)", "no .grad", ""), (ZERO, "zero", "dot"),
                               (NONFINITE, "NaN/Inf", "cross")):
        out.append(f'<rect x="{x}" y="15" width="14" height="12" fill="{fill}" stroke="#999" '
                   f'stroke-width="0.5"/>')
        if extra == "dot":
            out.append(f'<circle cx="{x + 7}" cy="21" r="1.6" fill="#333"/>')
        elif extra == "cross":
            out.append(f'<path d="M{x + 2} 17L{x + 12} 25M{x + 12} 17L{x + 2} 25" stroke="#fff"/>')
        out.append(f'<text x="{x + 18}" y="25">{label}</text>')
        x += 30 + 7 * len(label)
    out.append(f'<line x1="{x}" y1="14" x2="{x}" y2="28" stroke="#222" stroke-width="1.5" '
               f'stroke-dasharray="3 2"/><text x="{x + 5}" y="25">epoch end</text></svg>')
    return "".join(out)


def lines_svg(heat: Heatmap) -> str | None:
    """Per-step lines under the heatmap, on its step axis: the global gradient norm each update
    applied (and before clipping, where clip_grad_norm_ reported it), the lr of each param
    group, the GradScaler's scale. None when there is nothing to draw."""
    L = _Layout(heat)
    series = []  # (title, [(name, colour, [(x, value)])], log)
    applied, clipped, lrs, scales = [], [], {}, []
    for x, c in zip(L.col_x, heat.columns):
        mid = x + L.cw / 2
        if c.form == "step":
            applied.append((mid, c.total))
            clipped.append((mid, heat.clip_total.get(c.first)))
        else:  # a band or a gap: the norm lines break there (a band keeps no totals)
            applied.append((mid, None))
            clipped.append((mid, None))
        for g, lr in enumerate(c.lrs):
            lrs.setdefault(g, []).append((mid, lr))
        if c.first in heat.scale and c.form != "gap":
            scales.append((mid, heat.scale[c.first]))
    if not any(v is not None for _, v in clipped):
        clipped = []
    if not any(v is not None for _, v in applied):
        applied = []
    if applied or clipped:
        series.append(("global gradient norm", [
            ("before clipping (clip_grad_norm_)", "#ff7f0e", clipped),
            ("applied (after clipping)" if clipped else "applied by the step", "#1f77b4", applied)],
            True))
    if lrs:
        palette = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
        series.append(("learning rate", [(f"group {g}", palette[g % len(palette)], pts)
                                         for g, pts in sorted(lrs.items())], None))
    if scales:
        series.append(("GradScaler scale", [("scale", "#d62728", scales)], True))
    def drawable(lines) -> bool:
        return any(v is not None and math.isfinite(v) for _, _, pts in lines for _, v in pts)

    series = [(title, lines, log) for title, lines, log in series if drawable(lines)]
    if not series:
        return None
    h, gap = 70, 34
    height = len(series) * (h + gap) + 10
    width = L.right + 230
    out = [f'<svg class="gd-lines" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
           f'height="{height}" viewBox="0 0 {width:.0f} {height}" '
           f'font-family="system-ui, sans-serif" font-size="11">']
    for k, (title, lines, log) in enumerate(series):
        y0 = k * (h + gap) + 20
        values = [v for _, _, pts in lines for _, v in pts if v is not None and math.isfinite(v)]
        if log is None:
            log = bool(values) and min(values) > 0 and max(values) / min(values) > 20
        if log:
            values = [v for v in values if v > 0]
        if not values:
            continue
        f = (lambda v: math.log10(v)) if log else (lambda v: v)
        lo, hi = f(min(values)), f(max(values))
        if hi - lo < 1e-12:
            lo, hi = lo - 1, hi + 1
        out.append(f'<text x="{L.label_w}" y="{y0 - 5}" font-weight="600">'
                   f"{escape(title)}</text>"
                   f'<text x="{L.label_w - 6}" y="{y0 + 12}" text-anchor="end" fill="#666">'
                   f"{'log scale' if log else 'linear'}</text>"
                   f'<rect x="{L.label_w}" y="{y0}" width="{L.right - L.label_w:.1f}" height="{h}" '
                   f'fill="#fafafa" stroke="#ddd"/>'
                   f'<text x="{L.right + 4:.1f}" y="{y0 + 9}" fill="#666">{max(values):.3g}</text>'
                   f'<text x="{L.right + 4:.1f}" y="{y0 + h}" fill="#666">{min(values):.3g}</text>')
        for step in heat.epoch_ends:
            x = L.x_after_step(step)
            if x is not None:
                out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + h}" stroke="#222" '
                           f'stroke-dasharray="3 2"/>')
        ly = y0 + 36
        for name, stroke, pts in lines:
            segments: list[list] = [[]]  # a missing value breaks the line
            for x, v in pts:
                if v is not None and math.isfinite(v) and (v > 0 or not log):
                    segments[-1].append((x, v))
                elif segments[-1]:
                    segments.append([])
            segments = [seg for seg in segments if seg]
            if not segments:
                continue
            for seg in segments:
                coords = " ".join(f"{x:.1f},{y0 + h - 3 - (f(v) - lo) / (hi - lo) * (h - 6):.1f}"
                                  for x, v in seg)
                if len(seg) > 1:
                    dash = ' stroke-dasharray="5 3"' if name.startswith("before") else ""
                    out.append(f'<polyline points="{coords}" fill="none" stroke="{stroke}" '
                               f'stroke-width="1.5"{dash}><title>{escape(name)}</title></polyline>')
                else:
                    x, y = coords.split(",")
                    out.append(f'<circle cx="{x}" cy="{y}" r="2" fill="{stroke}"/>')
            out.append(f'<text x="{L.right + 44:.1f}" y="{ly}" fill="{stroke}">{escape(name)}</text>')
            ly += 14
    out.append("</svg>")
    return "".join(out)
