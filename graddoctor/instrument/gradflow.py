"""The gradient norms of every optimizer update, for the pictures (the HTML report's heatmap,
``--plot``, ``--grad-flow``): only built when one is asked for.

Per update it keeps the L2 norm of each gradient the step applies and the lr of each param
group. The norms are the optimizer watcher's own when it measured them (a host list it read
anyway); when it did not (the gradients were vouched finite by a clip or ``unscale_``) they are
taken here in one batched ``torch._foreach_norm`` per device and *kept on the device*: nothing
is copied to the host until the run ends (no host sync per step on CUDA).

Memory stays bounded on a run of any length: the first ``HEAD`` updates are kept whole, and so
are the last ``TAIL``; the ones in between are folded into bands of ``width`` updates holding,
per gradient, the min, the median and the max of its norm (reduced on the device). When there
are more than ``MAX_BANDS`` bands, neighbours merge (min of mins, max of maxes, mean of the
two medians) and the width doubles. At the end, one ``grad_flow`` event per optimizer.
"""

from __future__ import annotations

from collections import deque

import torch

from .. import events as ev
from .recorder import Recorder
from .topics import STEP_GRADS, STEPPED

HEAD = 200  # updates kept whole from the start (a default replay: every one)
TAIL = 40  # the latest updates kept whole
FIRST_WIDTH = 8  # updates per band at first
MAX_BANDS = 40  # bands kept before neighbours merge


def _number(value) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None  # a tensor lr (possibly on a device): not read, to keep the step sync-free


class _Column:
    __slots__ = ("step", "pids", "norms", "lrs")

    def __init__(self, step, pids, norms, lrs):
        self.step, self.pids, self.norms, self.lrs = step, pids, norms, lrs


class _Band:
    __slots__ = ("first", "last", "count", "pids", "low", "mid", "high", "lrs")

    def __init__(self, first, last, count, pids, low, mid, high, lrs):
        self.first, self.last, self.count, self.pids = first, last, count, pids
        self.low, self.mid, self.high, self.lrs = low, mid, high, lrs


def _as_tensor(norms) -> torch.Tensor:
    return norms if isinstance(norms, torch.Tensor) else torch.tensor(norms, dtype=torch.float32)


class _Series:
    """One optimizer's updates: head, bands, tail."""

    def __init__(self):
        self.head: list[_Column] = []
        self.tail: deque[_Column] = deque()
        self.pending: list[_Column] = []  # updates gathering into the next band
        self.bands: list[_Band] = []
        self.width = FIRST_WIDTH

    def add(self, column: _Column) -> None:
        if len(self.head) < HEAD:
            self.head.append(column)
            return
        self.tail.append(column)
        if len(self.tail) > TAIL:
            self._to_band(self.tail.popleft())

    def _to_band(self, column: _Column) -> None:
        if self.pending and self.pending[0].pids != column.pids:
            self._close_band()  # a param group was added: a band holds one set of gradients
        self.pending.append(column)
        if len(self.pending) >= self.width:
            self._close_band()

    def _close_band(self) -> None:
        pending, self.pending = self.pending, []
        if not pending:
            return
        with torch.no_grad():
            device = next((c.norms.device for c in pending if isinstance(c.norms, torch.Tensor)),
                          None)
            if device is None:  # host lists (the step measured them): one tensor from them all
                stacked = torch.tensor([c.norms for c in pending], dtype=torch.float32)
            else:
                stacked = torch.stack([_as_tensor(c.norms).to(device) for c in pending])
            # NaN/Inf must show in a band: amax keeps them (nan propagates through it). Not
            # min(0)/max(0): their (values, indices) kernel took ~8 ms per call on small CPU
            # tensors (torch 2.13), amin/amax ~4 us
            band = _Band(pending[0].step, pending[-1].step, len(pending), pending[0].pids,
                         stacked.amin(0), stacked.median(0).values, stacked.amax(0),
                         pending[-1].lrs)
        self.bands.append(band)
        if len(self.bands) > MAX_BANDS:
            self._merge_bands()

    def _merge_bands(self) -> None:
        merged: list[_Band] = []
        bands = self.bands
        i = 0
        with torch.no_grad():
            while i < len(bands):
                a = bands[i]
                b = bands[i + 1] if i + 1 < len(bands) else None
                if b is None or b.pids != a.pids:
                    merged.append(a)
                    i += 1
                    continue
                merged.append(_Band(a.first, b.last, a.count + b.count, a.pids,
                                    torch.minimum(a.low, b.low), (a.mid + b.mid) / 2,
                                    torch.maximum(a.high, b.high), b.lrs))
                i += 2
        self.bands = merged
        self.width *= 2

    def finish(self) -> tuple[list[list], list[list]]:
        self._close_band()

        def host(values) -> list[float]:
            return values.tolist() if isinstance(values, torch.Tensor) else list(values)

        columns = [[c.step, list(c.pids), host(c.norms), c.lrs] for c in (*self.head, *self.tail)]
        bands = [[b.first, b.last, b.count, list(b.pids), host(b.low), host(b.mid), host(b.high),
                  b.lrs] for b in self.bands]
        return columns, bands


class GradFlowWatcher:
    """Subscribes to the optimizer watcher's ``step_grads`` and ``stepped``; installs nothing."""

    def __init__(self, rec: Recorder):
        self.rec = rec
        self.series: dict[int, _Series] = {}
        self._pending: dict[int, tuple] = {}  # opt -> (pids, norms, lrs) of the step running
        rec.subscribe(STEP_GRADS, self.before_step)
        rec.subscribe(STEPPED, self.after_step)

    def install(self, patcher) -> None:
        pass

    def before_step(self, opt, optimizer, by_device, norm_pids, norms) -> None:
        try:
            if norms is None:  # not measured by the step: measure here, on the device
                norm_pids, parts = [], []
                with torch.no_grad():
                    for device_pids, grads in by_device.values():
                        norm_pids.extend(device_pids)
                        parts.append(torch.stack(torch._foreach_norm(grads)).float())
                if len(parts) > 1:
                    parts = [p.cpu() for p in parts]  # gradients on several devices: rare
                norms = torch.cat(parts) if parts else []
            lrs = [_number(group.get("lr")) for group in optimizer.param_groups]
            self._pending[opt] = (tuple(norm_pids), norms, lrs)
        except Exception as exc:
            self.rec.internal_error("gradient norms for the pictures", exc)

    def after_step(self, opt, optimizer) -> None:
        pending = self._pending.pop(opt, None)
        if pending is None:
            return  # a closure step: no norms
        try:
            series = self.series.get(opt)
            if series is None:
                series = self.series[opt] = _Series()
            pids, norms, lrs = pending
            last = series.tail[-1] if series.tail else (series.head[-1] if series.head else None)
            if last is not None and last.pids == pids:
                pids = last.pids  # one tuple shared by the updates of one set of gradients
            series.add(_Column(self.rec.progress.steps, pids, norms, lrs))
        except Exception as exc:
            self.rec.internal_error("gradient norms for the pictures", exc)

    def close(self) -> None:
        """At the end of the run (before the recorder's finish): one ``grad_flow`` event per
        optimizer, the device values read now."""
        for opt, series in self.series.items():
            try:
                columns, bands = series.finish()
                self.rec.emit(ev.grad_flow(opt=opt, columns=columns, bands=bands))
            except Exception as exc:
                self.rec.internal_error("gradient norms for the pictures", exc)
        self.series = {}
