"""Loss targets that are the loader's labels remapped, element by element, into labels that no
longer mean what the dataset's did (labels-remapped-wrongly).

Between the DataLoader and the loss a script often rewrites its labels: a cast, a lookup
table from raw annotation ids to train ids, a shift from 1-based ids, a standardisation of a
regression target. Three such rewrites train on the wrong answer and raise nothing:

* ``void``: the labels keep their classes except an out-of-range value (255 or -1 for "void",
  "unlabelled") that becomes one of the classes (``mask.clamp(0, C - 1)``, ``mask % C``,
  ``torch.where(mask == 255, 0, mask)``): the pixels nobody labelled are trained as that class;
* ``shifted``: labels that already cover the model's classes ``0 .. C - 1`` are shifted by a
  constant (``y - 1`` for ids taken as 1-based) onto the loss's ``ignore_index``: one class is
  never trained (its samples are ignored), every other sample is trained as its neighbour class;
* ``rescaled``: a float target that the loader serves already standardised (mean near 0, spread
  near 1) or scaled into [0, 1] is scaled down again (``(y - mean) / std`` of the raw data a
  second time): the loss sees a near-constant target;
* ``unscaled``: such a target put back into its units (``y * std + mean``, at least 5x wider)
  while the prediction it is compared with stays on the served scale (its mean within the
  served values' range of theirs, its spread within that range): the model must learn the
  units' offset and scale that the standardisation took away.

What is judged: among the first ``_CALLS`` calls with a gradient of the wrapped losses
(``LossCalls`` tells them), a CPU target without gradient that is not one of the latest
served batch's tensors but has the number of values of one of them (``BATCH_SERVED``, the
latest batch of up to ``_LOADERS`` loaders; references only). For ``cross_entropy`` /
``nll_loss`` with class indices, the pairs (label served, target) are counted (one ``unique``):
each served value must map to one target value (else it is no element-wise remap: nothing is
said), and the map is judged as above against the input's class count and the call's
``ignore_index``. For the regression losses, the target must be ``a * y + b`` of the served
``y`` (two values fit, every value checked) with ``|a|`` at most ``_SHRINK``, or at least
``1 / _SHRINK`` with the loss's input on the served scale (its mean and spread read once).

One ``target_remapped`` aside event per call line (loc: the loss call).

The same watcher catches a label map resized in the loop by averaging (label-map-interpolated;
the datasets' are seen by instrument/augalign.py): ``F.interpolate`` is wrapped until the loss
calls are done; among its first ``_RESIZES`` averaging resizes of a CPU tensor, those of a label
map (``label_map_values``) are checked for made-up pixels (``made_up``: the resize run again on each class's indicator) and
kept as the ids they round and floor to; a ``cross_entropy`` / ``nll_loss`` target equal to
those ids is told (``label_map_averaged`` at the resize, once per line).
"""

from __future__ import annotations

from threading import get_ident

import torch
import torch.nn.functional as F

from .. import events as ev
from .augalign import averaging, label_map_values, made_up
from .constlabels import ignored_index
from .inlinable import watched_call
from .recorder import Recorder
from .topics import BATCH_SERVED
from .patcher import put_back

_CALLS = 16  # loss calls with a gradient heard, at most
_LOADERS = 4  # loaders whose latest batch is kept
_FIELDS = 8  # tensors of one batch looked at, at most
_MAX_VALUES = 1 << 22  # values of a target read, at most
_MAX_LEVELS = 1024  # distinct served labels for a class map judged, at most
_REGRESSION = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
_CLASSES = ("cross_entropy", "nll_loss")
_SHRINK = 0.2  # a second scaling shrinks the target at least 5x
_MIN_VALUES = 8
_RESIZES = 16  # averaging CPU resizes in the loop looked at (label maps or not), at most
_RESIZE_VALUES = 1 << 20  # values of such a resize kept (as the ids it rounds to), at most


def _tensors(batch, depth: int = 0) -> list:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if depth > 1:
        return []
    if isinstance(batch, (tuple, list)):
        return [t for item in batch for t in _tensors(item, depth + 1)][:_FIELDS]
    if isinstance(batch, dict):
        return [t for item in list(batch.values())[:16] for t in _tensors(item, depth + 1)][:_FIELDS]
    return []


def judge_classes(served: torch.Tensor, target: torch.Tensor, classes: int,
                  ignore: int | None) -> dict | None:
    """The fault of class targets ``target`` made element by element from ``served`` (the same
    number of values), for a loss over ``classes`` classes ignoring ``ignore``; None if fine."""
    if served.is_floating_point() or served.dtype is torch.bool or served.is_complex():
        return None
    pairs = torch.stack([served.reshape(-1).long(), target.reshape(-1).long()], 1)
    pairs = torch.unique(pairs, dim=0)
    if pairs.shape[0] > _MAX_LEVELS:
        return None
    mapping: dict[int, int] = {}
    for raw, new in pairs.tolist():
        if raw in mapping:
            return None  # one served value to several targets: no element-wise remap
        mapping[raw] = new
    if len(mapping) < 2:
        return None
    inside = {r: n for r, n in mapping.items() if 0 <= r < classes}
    outside = {r: n for r, n in mapping.items() if not 0 <= r < classes}
    # void: the classes kept as they are, an out-of-range value made one of them
    if inside and len(inside) >= 2 and all(r == n for r, n in inside.items()):
        for raw, new in sorted(outside.items()):
            if raw == ignore or not 0 <= new < classes or new not in inside.values():
                continue
            count = int((served == raw).sum())
            return {"how": "void", "raw": int(raw), "new": int(new), "classes": classes,
                    "ignore_index": ignore, "count": count, "values": int(served.numel()),
                    "labels": sorted(int(r) for r in mapping)[:16]}
    # shifted: labels covering 0 .. C-1 moved by one constant, some onto ignore_index
    shifts = {n - r for r, n in mapping.items()}
    if len(shifts) == 1 and not outside and len(inside) >= 2:
        k = shifts.pop()
        if k != 0 and min(mapping) == 0 and max(mapping) == classes - 1:
            lost = [r for r, n in mapping.items() if n == ignore]
            if lost:
                count = int(sum(int((served == r).sum()) for r in lost))
                return {"how": "shifted", "raw": int(lost[0]), "new": int(lost[0] + k),
                        "classes": classes, "ignore_index": ignore, "count": count,
                        "values": int(served.numel()), "shift": int(k),
                        "labels": sorted(int(r) for r in mapping)[:16]}
    return None


def judge_scale(served: torch.Tensor, target: torch.Tensor, prediction=None) -> dict | None:
    """The second scaling of a float target already scaled when served, or (given the loss's
    ``prediction``) its scaling back into units against a prediction left on the served scale;
    None when neither."""
    if not served.is_floating_point() or not target.is_floating_point():
        return None
    y = served.detach().reshape(-1).double()
    t = target.detach().reshape(-1).double()
    if y.numel() < _MIN_VALUES:
        return None
    mean, std = float(y.mean()), float(y.std())
    low, high = float(y.min()), float(y.max())
    standardised = abs(mean) < 0.75 and 0.5 < std < 2.0
    unit = low >= -1.05 and high <= 1.05 and high - low > 0.3
    if not (standardised or unit):
        return None
    i, j = int(torch.argmin(y)), int(torch.argmax(y))
    if float(y[j] - y[i]) <= 1e-6 * max(1.0, abs(high)):
        return None
    a = float((t[j] - t[i]) / (y[j] - y[i]))
    b = float(t[i] - a * y[i])
    fitted = a * y + b
    scale = max(float(t.abs().max()), 1e-12)
    if not bool(((fitted - t).abs() <= 1e-4 * scale + 1e-7).all()):
        return None  # not an affine map of the served values
    if a != 0 and abs(a) >= 1 / _SHRINK and isinstance(prediction, torch.Tensor) \
            and prediction.is_floating_point() and prediction.numel() == t.numel():
        # put back into units (``z * std + mean``) while the prediction stays on the served
        # scale: it sits within the served values' own range, not the target's
        p = prediction.detach().reshape(-1).double()
        span = max(high - low, 1e-6)
        p_mean, p_std = float(p.mean()), float(p.std())
        if abs(p_mean - mean) <= span and p_std <= span:
            return {"how": "unscaled", "scale": round(a, 6), "offset": round(b, 6),
                    "served": "standardised" if standardised else "unit", "mean": round(mean, 4),
                    "std": round(std, 4), "target_mean": round(float(t.mean()), 6),
                    "target_std": round(float(t.std()), 6), "values": int(y.numel()),
                    "prediction_mean": round(p_mean, 6), "prediction_std": round(p_std, 6)}
        return None
    if a == 0 or abs(a) > _SHRINK:
        return None
    return {"how": "rescaled", "scale": round(a, 6), "offset": round(b, 6),
            "served": "standardised" if standardised else "unit", "mean": round(mean, 4),
            "std": round(std, 4), "target_mean": round(float(t.mean()), 6),
            "target_std": round(float(t.std()), 6), "values": int(y.numel())}


class TargetRemapWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._calls = 0
        self._served: dict = {}  # loader -> its latest batch (while open)
        self._told: set = set()
        # averaging resizes of a label map outside the datasets' fetches, kept until the loss
        # calls are heard: (ids rounded, ids floored, Location, mode, values, made-up variants)
        self._resizes: list = []
        self._resized_count = 0
        self._restore: list = []
        self._interpolate = F.interpolate

    def install(self, patcher) -> None:
        original = self._interpolate = F.interpolate
        wrapper = patcher.patch(F, "interpolate", watched_call(original, self._resized))
        self._restore.append((F, "interpolate", original, wrapper))

    def _resized(self, args, kwargs, result) -> None:
        """``F.interpolate`` ran (the wrapper's after): an averaging resize of a label map is
        kept, with the ids it makes once rounded or cast, for the loss calls to look up."""
        if not self.open or self._resized_count >= _RESIZES or not isinstance(result, torch.Tensor) \
                or get_ident() != self.rec.script_thread or result.numel() > _RESIZE_VALUES:
            return
        try:
            mode = averaging(args, kwargs)
            if mode is None:
                return
            source = args[0] if args else kwargs.get("input")
            if not isinstance(source, torch.Tensor) or source.device.type != "cpu":
                return
            self._resized_count += 1  # averaging resizes looked at, label maps or not
            values = label_map_values(source)
            if values is None:
                return
            with torch.no_grad():
                variants = made_up(self._interpolate, source, args, kwargs, result, values)
                if max(v[0] for v in variants) == 0:
                    return
                flat = result.detach().reshape(-1)
                self._resizes.append((torch.round(flat).long(), torch.floor(flat).long(),
                                      self.rec.here(), mode, sorted(int(v) for v in values.tolist()),
                                      variants))
        except Exception as exc:
            self._resized_count = _RESIZES
            self.rec.internal_error("target remap (resize)", exc)

    def _resized_target(self, target) -> bool:
        """A class target that is the ids of a kept resize: told (once per resize line)."""
        flat = target.detach().reshape(-1).long()
        for rounded, floored, loc, mode, values, variants in self._resizes:
            if rounded.numel() != flat.numel():
                continue
            for made, variant in ((rounded, variants[0]), (floored, variants[1])):
                if variant[0] > 0 and torch.equal(made, flat):
                    if loc not in self._told:
                        self._told.add(loc)
                        self.rec.emit_aside(ev.label_map_averaged(
                            cls=None, field="target", op="interpolate", mode=mode,
                            levels=values, new=variant[1], share=round(variant[0], 4),
                            shape=[int(n) for n in target.shape[-2:]]), loc)
                    return True
        return False

    @property
    def open(self) -> bool:
        return self._calls < _CALLS

    def served(self, loader: int, epoch: int, index: int, batch) -> None:
        """``BATCH_SERVED``: the batch, kept until its loader's next one (references only)."""
        if not self.open:
            self._close()
            return
        self._served.pop(loader, None)
        self._served[loader] = batch
        if len(self._served) > _LOADERS:
            del self._served[next(iter(self._served))]

    def loss_call(self, fn: str, input, target, args, kwargs) -> None:
        self._calls += 1
        if not self.open:
            self._close()
        if fn not in _CLASSES and fn not in _REGRESSION:
            return
        if not isinstance(target, torch.Tensor) or not isinstance(input, torch.Tensor) \
                or target.requires_grad or target.device.type != "cpu" \
                or target.numel() > _MAX_VALUES or target.numel() < _MIN_VALUES:
            return
        try:
            if fn in _CLASSES and (target.is_floating_point() or input.dim() < 2):
                return
            if fn in _CLASSES and self._resizes and self._resized_target(target):
                return
            sources = self._sources(target)
            if not sources:
                return
            verdicts = []
            with torch.no_grad():
                for served in sources[:_FIELDS]:
                    if fn in _CLASSES:
                        found = judge_classes(served, target, int(input.shape[1]),
                                              ignored_index(fn, target, args, kwargs))
                    else:
                        found = judge_scale(served, target, input)
                    if found is not None:
                        verdicts.append(found)
            if len(verdicts) != 1:
                return  # none, or two served tensors that could be its source: not told apart
            found = verdicts[0]
            loc = self.rec.here()
            if loc in self._told:
                return
            self._told.add(loc)
            self.rec.emit_aside(ev.target_remapped(fn=fn, shape=[int(s) for s in target.shape],
                                                   **found), loc)
        except Exception as exc:
            self._calls = _CALLS
            self._close()
            self.rec.internal_error("target remap", exc)

    def _close(self) -> None:
        """Done: the batches let go of, off ``BATCH_SERVED``."""
        self._served, self._resizes = {}, []
        self.rec.retire(BATCH_SERVED, self.served)
        restore, self._restore = self._restore, []
        for owner, name, original, wrapper in restore:
            try:  # not from under another watcher's wrapper
                put_back(owner, name, original, wrapper)
            except Exception as exc:
                self.rec.internal_error("target remap", exc)

    def _sources(self, target) -> list | None:
        """The served tensors ``target`` may have been made from element by element: those of
        the latest batches with its number of values (and kind: integer or floating); None when
        ``target`` is one of them as served (itself, or a reshape or cast that kept its values)."""
        found = []
        for batch in reversed(list(self._served.values())):
            for t in _tensors(batch):
                if t is target:
                    return None  # the labels as served
                if t.device.type != "cpu" or t.numel() != target.numel() or t.is_complex() \
                        or t.dim() == 0 or t.is_floating_point() != target.is_floating_point():
                    continue
                if torch.equal(t.reshape(-1).double(), target.detach().reshape(-1).double()):
                    return None
                found.append(t)
        return found
