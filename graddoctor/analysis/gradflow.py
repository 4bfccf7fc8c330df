"""Per-layer gradient norms: each optimizer's last update (``--grad-flow``'s bars, from the
``step_begin`` events' summary: report/gradflow.py) and every update (``heatmaps``: the pictures
of report/svg.py, report/html.py and report/plot.py, from the ``grad_flow`` events recorded when
a picture is asked for, else from the norms the trace's steps kept).

A layer is a parameter name without its last part (``model.fc1.weight`` -> ``model.fc1``); its
norm is the L2 norm over its parameters (sqrt of the sum of squares). No torch, no rich.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..trace import Event
    from . import Analysis


@dataclass
class LayerNorm:
    layer: str
    norm: float | None  # nan when a gradient is not finite; None when no parameter had a .grad
    params: int  # parameters with a gradient
    without_grad: int = 0  # parameters the optimizer owns whose .grad was None


@dataclass
class UpdateNorms:
    opt: int
    step: int  # 1-based optimizer step
    layers: list[LayerNorm]


def layer_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else name


def last_update_norms(a: "Analysis") -> list[UpdateNorms]:
    """For every optimizer, its last step's per-layer gradient norms (in parameter order)."""
    latest: dict[int, tuple[int, object, list]] = {}  # opt -> (step number, step_begin, without)
    pending: dict[int, object] = {}
    for event in a.events:
        if event.kind == "step_begin" and event.get("norm_pids") is not None and not event.get("closure"):
            pending[event["opt"]] = event
        elif event.kind == "step":
            begin = pending.pop(event.get("opt"), None)
            if begin is not None:
                latest[event["opt"]] = (a.step_number[event.seq], begin, list(event.get("without_grad") or ()))
    out = []
    for opt, (step, begin, without) in sorted(latest.items(), key=lambda kv: kv[1][0]):
        sums: dict[str, float] = {}
        layers: dict[str, LayerNorm] = {}
        first_pid: dict[str, int] = {}  # layers in parameter order (pids follow construction)
        for pid in [*begin["norm_pids"], *without]:
            layer = layer_of(a.param_name(pid))
            first_pid[layer] = min(pid, first_pid.get(layer, pid))
        for layer in sorted(first_pid, key=first_pid.get):
            layers[layer] = LayerNorm(layer, None, 0)
        for pid, norm in zip(begin["norm_pids"], begin["norms"]):
            layer = layer_of(a.param_name(pid))
            layers[layer].params += 1
            norm = float(norm)
            sums[layer] = sums.get(layer, 0.0) + (norm * norm if math.isfinite(norm) else math.nan)
        for pid in without:
            layers[layer_of(a.param_name(pid))].without_grad += 1
        for layer, total in sums.items():
            layers[layer].norm = math.sqrt(total) if math.isfinite(total) else math.nan
        if layers:
            out.append(UpdateNorms(opt, step, list(layers.values())))
    return out


# -- the heatmap: every update's per-layer gradient norms ----------------------------------

@dataclass
class HeatColumn:
    """One column of the heatmap: an update kept whole (``step``), a band of a long run's
    updates folded by the recorder into min/median/max (``band``), or updates with no norms to
    show (``gap``: folded out of the trace, skipped by a GradScaler, closure steps, not measured)."""

    form: str  # "step" | "band" | "gap"
    first: int  # step numbers (1-based), inclusive
    last: int
    count: int  # updates it stands for
    values: list[float | None] = field(default_factory=list)  # per row; band: the median
    low: list[float | None] | None = None  # band: per row, the min
    high: list[float | None] | None = None  # band: per row, the max
    lrs: list[float | None] = field(default_factory=list)  # per param group
    total: float | None = None  # the global L2 norm of the gradients the update applied
    why: str = ""  # gap: why there is nothing to show


@dataclass
class Heatmap:
    opt: int
    optimizer: str  # "AdamW (optimizer)"
    rows: list[str]  # layers, in model order
    groups: list[tuple[str, int, int]]  # (module, first row, rows): rows grouped by module
    columns: list[HeatColumn]
    source: str  # "recorded" (every update) | "trace" (the norms the trace kept)
    epoch_ends: list[int] = field(default_factory=list)  # step numbers an epoch ended after
    micro: dict[int, int] = field(default_factory=dict)  # step -> backward calls it applied
    clip_total: dict[int, float] = field(default_factory=dict)  # step -> norm before clipping
    scale: dict[int, float] = field(default_factory=dict)  # step -> GradScaler scale it used
    skipped: list[int] = field(default_factory=list)  # steps a GradScaler skipped
    # BatchNorm/dropout layer -> step -> the mode its forwards ran in during that update
    # ("train" | "eval" | "mixed"); gradient-carrying forwards only (not a no_grad validation)
    modes: dict[str, dict[int, str]] = field(default_factory=dict)

    def cells(self) -> int:
        """Cells drawn: one per (row, column)."""
        return len(self.rows) * len(self.columns)


def _layer_values(pids, norms, row_of: dict[str, int], rows: int, names) -> list[float | None]:
    """Per row, the L2 norm over the layer's parameters (nan when one is not finite; None when
    none of them had a gradient in ``pids``)."""
    sums: list[float | None] = [None] * rows
    for pid, norm in zip(pids, norms):
        row = row_of.get(layer_of(names(pid)))
        if row is None or norm is None:
            continue
        norm = float(norm)
        square = norm * norm if math.isfinite(norm) else math.nan
        sums[row] = square if sums[row] is None else sums[row] + square
    return [None if s is None else (math.sqrt(s) if math.isfinite(s) else math.nan) for s in sums]


def _total(norms) -> float | None:
    squares = [float(n) ** 2 for n in norms if n is not None]
    return math.sqrt(sum(squares)) if squares else None


def step_lrs(a: "Analysis") -> dict[tuple[int, int], list[float | None]]:
    """(opt, step) -> the lr of each param group at that update, as the trace has it (the
    ``grad_flow`` events' columns; a band keeps its last update's). The one place the pictures
    read an update's lr from. Not ``Analysis.lr_timeline``: that one holds only the steps a
    folded run kept whole, while the recording keeps an lr for every column and band."""
    out = {}
    for e in a.by_kind.get("grad_flow", ()):
        for step, _pids, _norms, lrs in e.get("columns", ()):
            out[(e["opt"], step)] = list(lrs or ())
    return out


def _module_of(layer: str) -> str:
    return layer_of(layer) if "." in layer else layer


def heatmaps(a: "Analysis") -> list[Heatmap]:
    """One heatmap per optimizer that stepped with gradients: from its ``grad_flow`` event
    when a picture was asked for while recording, else from the norms the trace's steps kept."""
    recorded = {e["opt"]: e for e in a.by_kind.get("grad_flow", ())}
    by_opt: dict[int, list] = {}  # opt -> [(first, last, count, form, pids, values, low, high, lrs, why)]
    if recorded:
        for opt, e in recorded.items():
            items = by_opt.setdefault(opt, [])
            for step, pids, norms, lrs in e.get("columns", ()):
                items.append((step, step, 1, "step", pids, norms, None, None, lrs, ""))
            for first, last, count, pids, low, mid, high, lrs in e.get("bands", ()):
                items.append((first, last, count, "band", pids, mid, low, high, lrs, ""))
    else:
        pending: dict[int, Event] = {}
        for event in a.events:
            if event.kind == "step_begin" and not event.get("closure"):
                pending[event["opt"]] = event
            elif event.kind == "step" and not event.get("skipped"):
                begin = pending.pop(event.get("opt"), None)
                if begin is None or begin.get("norms") is None:
                    continue
                step = a.step_number[event.seq]
                by_opt.setdefault(event["opt"], []).append(
                    (step, step, 1, "step", begin["norm_pids"], begin["norms"], None, None, [], ""))
    lr_of = step_lrs(a)
    out = []
    for opt, items in sorted(by_opt.items()):
        items.sort(key=lambda item: item[0])
        # rows: every layer seen, ordered by its first parameter (pids follow construction)
        first_pid: dict[str, int] = {}
        for pid in [p for item in items for p in item[4]] + list(a.opt_params.get(opt, ())):
            layer = layer_of(a.param_name(pid))
            first_pid[layer] = min(pid, first_pid.get(layer, pid))
        rows = sorted(first_pid, key=lambda layer: first_pid[layer])
        # the optimizer's own layers are rows even when they never got a gradient ("no .grad")
        row_of = {layer: i for i, layer in enumerate(rows)}
        groups: list[tuple[str, int, int]] = []
        for i, layer in enumerate(rows):
            module = _module_of(layer)
            if groups and groups[-1][0] == module:
                groups[-1] = (module, groups[-1][1], groups[-1][2] + 1)
            else:
                groups.append((module, i, 1))
        columns: list[HeatColumn] = []
        expected = 1
        for first, last, count, form, pids, values, low, high, lrs, why in items:
            if first > expected:
                columns.append(_gap(a, expected, first - 1))
            layer_values = _layer_values(pids, values, row_of, len(rows), a.param_name)
            if form == "step":  # the lr of an update comes from one place (step_lrs)
                lrs = lr_of.get((opt, first), ())
            column = HeatColumn(form, first, last, count, layer_values, lrs=list(lrs or ()))
            if form == "band":
                column.low = _layer_values(pids, low, row_of, len(rows), a.param_name)
                column.high = _layer_values(pids, high, row_of, len(rows), a.param_name)
            else:
                column.total = _total(values)
            columns.append(column)
            expected = last + 1
        if expected <= a.step_count and columns:
            columns.append(_gap(a, expected, a.step_count))
        if not columns:
            continue
        heat = Heatmap(opt, a.optimizer_name(opt), rows, groups, columns,
                       "recorded" if recorded else "trace")
        _axis_marks(a, heat)
        out.append(heat)
    return out


def _gap(a: "Analysis", first: int, last: int) -> HeatColumn:
    skipped = sum(1 for s in a.steps if s.get("skipped") and first <= a.step_number[s.seq] <= last)
    count = last - first + 1
    if skipped == count:
        why = "skipped by the GradScaler (inf/NaN gradients)"
    elif a.folded_steps:
        why = "folded out of the trace (no picture was asked for while recording)"
    else:
        why = "no gradient norms recorded (closure steps, or not measured)"
    return HeatColumn("gap", first, last, count, why=why)


def _axis_marks(a: "Analysis", heat: Heatmap) -> None:
    """What the step axis shows: epoch ends, micro-batches per update, clipping, the loss
    scale, skipped steps, the modes of the forwards."""
    seen_loaders: set = set()
    for e in a.by_kind.get("epoch_start", ()):
        loader = e.get("loader")
        if loader in seen_loaders:
            step = a.steps_before(e.seq)
            if step and step not in heat.epoch_ends:
                heat.epoch_ends.append(step)
        seen_loaders.add(loader)
    for w in a.windows.get(heat.opt, ()):
        heat.micro[w.index] = len(w.backwards)
    for e in a.by_kind.get("clip", ()):
        total = e.get("total_norm")
        if isinstance(total, (int, float)) and math.isfinite(total):
            heat.clip_total[a.steps_before(e.seq) + 1] = float(total)
    for e in a.by_kind.get("scaler_update", ()):
        scale = e.get("scale")
        if isinstance(scale, (int, float)):
            heat.scale[a.steps_before(e.seq)] = float(scale)
    heat.skipped = [a.step_number[s.seq] for s in a.steps if s.get("skipped")]
    names = a.modes.name if a.by_kind.get("mode_module") else (lambda mid: f"layer#{mid}")
    for e in a.by_kind.get("mode_forward", ()):
        if not e.get("grad") or e.get("inference"):
            continue  # an evaluation pass under no_grad is not part of an update
        step = a.steps_before(e.seq) + 1
        mode = "train" if e.get("training") else "eval"
        for mid in e.get("modules", ()):
            per_step = heat.modes.setdefault(names(mid), {})
            old = per_step.get(step)
            per_step[step] = mode if old in (None, mode) else "mixed"
