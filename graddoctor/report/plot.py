"""``--plot FILE.png|svg|pdf``: the gradient flow drawn with matplotlib (the optional extra
``graddoctor[plots]``), for a notebook or a paper. Two panels per optimizer:

* the classic gradient-flow chart: per layer, the mean and the max over the updates of its
  gradient's L2 norm, on a log scale (a vanishing layer sits at the bottom; one that never got a
  gradient is marked);
* the heatmap of every update (analysis/gradflow.py, as in the HTML report), epoch ends dashed.

Reads the ``Report`` only; draws with the Agg backend (no display needed).
"""

from __future__ import annotations

import math

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def missing_matplotlib() -> str | None:
    """Why --plot cannot draw here, or None."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed (pip install 'graddoctor[plots]')"
    return None


def plot(report, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    heats = report.analysis.heatmaps if report.analysis is not None else []
    if not heats:
        fig, ax = plt.subplots(figsize=(6, 2))
        ax.axis("off")
        ax.text(0.5, 0.5, "no optimizer step with gradients was seen", ha="center")
        fig.savefig(path)
        plt.close(fig)
        return
    fig, axes = plt.subplots(len(heats), 2, figsize=(14, 1.6 + 0.32 * max(len(h.rows) for h in heats)
                                                       * len(heats) + 1.5 * len(heats)),
                             squeeze=False, gridspec_kw={"width_ratios": [1, 2.4]})
    for (bars, heat_ax), h in zip(axes, heats):
        steps = [c for c in h.columns if c.form != "gap"]
        rows = len(h.rows)
        means, maxes, none = [], [], []
        for i in range(rows):
            vals = [c.values[i] for c in steps if c.values[i] is not None and math.isfinite(c.values[i])]
            means.append(sum(vals) / len(vals) if vals else float("nan"))
            maxes.append(max(vals) if vals else float("nan"))
            none.append(not vals)
        y = list(range(rows))
        bars.barh(y, maxes, color="#9ecae1", label="max")
        bars.barh(y, means, color="#3182bd", height=0.5, label="mean")
        for i in y:
            if none[i]:
                bars.text(0.02, i, "no gradient", transform=bars.get_yaxis_transform(),
                          va="center", color="#b00")
        bars.set_xscale("log")
        _log_ticks(bars.xaxis, [v for v in means + maxes if math.isfinite(v) and v > 0])
        bars.set_yticks(y, h.rows, fontsize=8)
        bars.invert_yaxis()
        bars.set_xlabel("gradient L2 norm per update (log)")
        bars.set_title(f"{h.optimizer}: gradient flow", fontsize=10)
        # below the axes, never over a bar
        bars.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 1.2 / (rows + 4)),
                    ncol=2, frameon=False)
        # the heatmap: a column per shown column (bands: their median), NaN for no .grad
        import numpy as np

        grid = np.full((rows, len(h.columns)), np.nan)
        for j, c in enumerate(h.columns):
            if c.form == "gap":
                continue
            for i, v in enumerate(c.values):
                if v is not None and math.isfinite(v) and v > 0:
                    grid[i, j] = v
        finite = grid[np.isfinite(grid)]
        cmap = matplotlib.colormaps["viridis"].copy()
        cmap = cmap.with_extremes(bad="#d9d9d9")
        norm = LogNorm(vmin=finite.min(), vmax=finite.max()) if finite.size and finite.min() < finite.max() else None
        image = heat_ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
        for j, c in enumerate(h.columns):
            for i, v in enumerate(c.values if c.form != "gap" else ()):
                if v is not None and not math.isfinite(v):
                    heat_ax.plot(j, i, "x", color="#d62728", markersize=5)
        labels = [str(c.first) for c in h.columns]
        # as many labels as fit the panel's width at their own length (a folded run's step
        # numbers grow to 4-5 digits): never overlapping
        width_in = fig.get_figwidth() * 2.4 / 3.4 * 0.85
        room = max(2, int(width_in * 72 / (6.5 * max(len(s) for s in labels) + 12)))
        every = max(1, math.ceil(len(labels) / room))
        heat_ax.set_xticks(range(0, len(labels), every), labels[::every], fontsize=8)
        heat_ax.set_yticks(y, h.rows, fontsize=8)
        for step in h.epoch_ends:
            j = next((j for j, c in enumerate(h.columns) if c.first <= step <= c.last), None)
            if j is not None:
                heat_ax.axvline(j + 0.5, color="black", linestyle="--", linewidth=1)
        heat_ax.set_xlabel("optimizer step (grey: no .grad or not recorded; bands: median)")
        heat_ax.set_title("every update: gradient L2 norm per layer", fontsize=10)
        bar = fig.colorbar(image, ax=heat_ax, fraction=0.03, pad=0.01)
        if norm is not None:
            _log_ticks(bar.ax.yaxis, [float(finite.min()), float(finite.max())])
            bar.ax.yaxis.set_tick_params(labelsize=8)
    fig.suptitle(title(report), fontsize=11, x=0.01, ha="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def title(report) -> str:
    """The picture's title: the script and what was found there."""
    from ..notebook import describe

    active = report.active()
    if not active:
        found = "no gradient bugs found"
    else:
        f = active[0]
        where = f" at {describe(f.location.path, f.location.line)}" if f.location else ""
        found = f"{f.severity.value} {f.code} {f.rule}{where}" + (
            f" (+{len(active) - 1} more)" if len(active) > 1 else "")
    return f"graddoctor · {report.run.script}: {found}"


def _log_ticks(axis, values) -> None:
    """A log axis labelled at its decades, or at 1-2-5 steps when it spans less than one,
    plainly written; minor ticks unlabelled (matplotlib labels them on a short range, where
    their labels overlap)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if not values:
        return
    span = math.log10(max(values)) - math.log10(min(values))
    subs = (1.0,) if span >= 2 else (1.0, 2.0, 5.0)
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=6))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.2g}"))
    axis.set_minor_formatter(NullFormatter())
