"""Sampling grids given to ``F.grid_sample`` on the wrong scale (grid-not-normalised).

``F.grid_sample(input, grid)`` reads ``grid`` in normalised coordinates: -1 is the left (top)
edge of ``input``, +1 the right (bottom) edge, whatever its size. A grid written in pixel units
(``xs + flow[:, 0]`` with ``xs = arange(W)``: the warp of optical flow, a spatial transformer's
translation in pixels, keypoint offsets) lies almost entirely past +1: every such point reads
the padding (zeros, or the border pixel repeated), so the warped image is nearly blank, the
photometric loss compares the target with padding and its gradient with respect to the flow is
zero almost everywhere. A grid normalised to [0, 1] instead of [-1, 1] (``xs / (W - 1)``) reads
only the bottom-right quarter of the image, stretched over the whole output. Nothing raises
either way.

What is judged: the first ``_CALLS`` calls of ``grid_sample`` under grad mode from the script's
thread, on a grid of at least ``_MIN_POINTS`` points (CPU tensors; a device's only before the
first optimizer step, no host sync after it): one ``aminmax`` per coordinate and the share of
values past ±(1 + ``_SLACK``). ``pixels``: at least ``_OUTSIDE`` of the grid's values lie outside
[-1, 1] and the largest reaches past ``_PIXEL_HIGH``; ``unit``: no value below 0, every
coordinate spanning [0, 1] (from at most ``_EDGE`` to at least 1 - ``_EDGE``). One
``grid_scale`` aside event per call line (loc: the user's line of the call).

Silent: grids normalised to [-1, 1] (``F.affine_grid``'s, a ``linspace(-1, 1)`` base grid plus a
normalised flow; a flow that pushes some points past the edges: under ``_OUTSIDE``), a zoom into
part of the image (a coordinate that does not span all of [0, 1]), small grids (fewer points than
``_MIN_POINTS``: an ROI of a few samples).

Cost: ``F.grid_sample`` wrapped until ``_CALLS`` calls have been judged or ``WINDOW`` backwards
have run, then put back (nothing for the rest of the run).
"""

from __future__ import annotations

from threading import get_ident

import torch
import torch.nn.functional as F

from .. import events as ev
from .inlinable import watched
from .recorder import Recorder
from .topics import DESCRIBE_LOSS
from .patcher import put_back

WINDOW = 3  # backwards after which the wrapper is put back
_CALLS = 8  # calls judged, at most
_MIN_POINTS = 64  # sampling points a judged grid has, at least
_SLACK = 0.05  # a normalised grid plus a small flow may reach a little past the edges
_OUTSIDE = 0.5  # share of the grid's values outside [-1, 1] judged pixel units
_PIXEL_HIGH = 2.0  # a pixel grid's largest coordinate reaches past this (a few pixels at least)
_EDGE = 0.1  # a [0, 1] grid spans from at most this to at least 1 - this in each coordinate


def judge_grid(grid: torch.Tensor) -> dict | None:
    """The scale fault of ``grid`` (the event's data but its location fields), or None."""
    if not isinstance(grid, torch.Tensor) or not grid.is_floating_point() or grid.dim() < 3:
        return None
    coords = int(grid.shape[-1])
    if coords not in (2, 3) or grid.numel() // coords < _MIN_POINTS:
        return None
    with torch.no_grad():
        g = grid.detach().reshape(-1, coords).float()
        low = g.min(0).values
        high = g.max(0).values
        outside = (g.abs() > 1.0 + _SLACK).float().mean()
        read = torch.cat([low, high, outside.reshape(1)]).tolist()
    lows, highs, share = read[:coords], read[coords:2 * coords], read[-1]
    if not all(v == v and abs(v) != float("inf") for v in read):
        return None  # NaN or inf coordinates: nonfinite-grad's business
    lo, hi = min(lows), max(highs)
    if share >= _OUTSIDE and hi > _PIXEL_HIGH:
        how = "pixels"
    elif lo >= -1e-3 and hi <= 1.0 + _SLACK and all(v <= _EDGE for v in lows) \
            and all(v >= 1.0 - _EDGE for v in highs):
        how = "unit"
    else:
        return None
    return {"how": how, "low": round(lo, 4), "high": round(hi, 4), "outside": round(share, 4),
            "coords": coords}


class GridScaleWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._open = True
        self._calls = 0
        self._backwards = 0
        self._told: set = set()
        self._restore: list = []  # (owner, name, original) put back when the window ends

    def install(self, patcher) -> None:
        original = getattr(F, "grid_sample", None)
        if original is None:
            return
        wrapper = patcher.patch(F, "grid_sample", watched(original, self._before))
        self._restore.append((F, "grid_sample", original, wrapper))

    def _before(self, args, kwargs) -> None:
        if not self._open or not torch.is_grad_enabled() or get_ident() != self.rec.script_thread:
            return
        try:
            input = args[0] if args else kwargs.get("input")
            grid = args[1] if len(args) > 1 else kwargs.get("grid")
            if not isinstance(grid, torch.Tensor) or not isinstance(input, torch.Tensor):
                return
            if grid.device.type != "cpu" and self.rec.progress.steps:
                return  # no host sync once the updates run
            self._calls += 1
            if self._calls > _CALLS:
                self._close()
                return
            found = judge_grid(grid)
            if found is None:
                return
            loc = self.rec.here()
            if loc in self._told:
                return
            self._told.add(loc)
            mode = args[3] if len(args) > 3 else kwargs.get("mode", "bilinear")
            padding = args[4] if len(args) > 4 else kwargs.get("padding_mode", "zeros")
            self.rec.emit_aside(ev.grid_scale(
                **found, size=[int(s) for s in input.shape[2:]], padding=str(padding),
                mode=str(mode), grad=bool(grid.requires_grad)), loc)
        except Exception as exc:
            self._close()
            self.rec.internal_error("grid scale", exc)

    def describe_loss(self, tensors) -> dict:
        """``DESCRIBE_LOSS``: the wrapper is put back after ``WINDOW`` backwards."""
        self._backwards += 1
        if self._open and self._backwards >= WINDOW:
            self._close()
        return {}

    def _close(self) -> None:
        """Put torch's own grid_sample back (the patcher's undo at exit finds it as it was)."""
        if not self._open:
            return
        self._open = False
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        for owner, name, original, wrapper in self._restore:
            try:  # not from under another watcher's wrapper
                put_back(owner, name, original, wrapper)
            except Exception as exc:
                self.rec.internal_error("grid scale", exc)
