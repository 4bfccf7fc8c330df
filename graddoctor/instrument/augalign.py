"""An input and its dense target (a segmentation mask) moved differently by a dataset's
augmentation: the image flipped and the mask not, or flipped along the other axis, cropped at
another offset, rotated, resized where the mask is cropped.

What the run observes: on the first ``FETCHES`` batched fetches of each map-style dataset in the
script's thread (the DataLoader's in-process fetch), a ``TorchFunctionMode`` is pushed around the
fetch. For each tensor made there it keeps where each of its pixels (its last two axes) comes
from in the tensor it was made from: a pair of coordinate grids (rows, columns). A geometric
op (``flip``, ``rot90``, ``transpose``, indexing, ``roll``, ``F.pad``, ``F.interpolate``,
``F.grid_sample``...) is applied once more, with the script's own arguments, to the input's
grids (tensors of graddoctor's: nothing the script holds is touched, nothing random is drawn:
every one of those ops is deterministic); any other op whose result keeps the last two axes of
one input (arithmetic, casts, normalisation, colour jitter, noise added, a channel taken)
keeps that input's grids; a tensor made from nothing tracked (stored data, ``torch.zeros``) is
its own grid. The fetch's ``collate_fn`` is wrapped for that fetch only, to see the samples
before they are stacked.

A sample is judged when it holds an *image* (floating, more than ``_LEVELS`` distinct values)
and a *mask* (integer or boolean, or floating with at most ``_LEVELS`` values; not constant) with the same
last two axes: their grids must agree to within half a pixel, or after a resize half a source
step and half a pixel (a bilinear and a nearest resize to the same size agree). Two images (a contrastive pair's
views), an image and a class label, and anything made outside torch (NumPy, PIL) are not
judged; a mask made by an untracked op counts as not moved, so only the ops seen can differ.

The same mode follows a label map's *values* (label-map-interpolated): an ``F.interpolate`` with
an averaging mode (linear, bilinear, bicubic, trilinear, area, or ``antialias``) of a floating
map of ``_MIN_CLASSES`` to ``_CLASSES`` integer values is run again, with the script's
arguments, on each value's indicator (``map == v``), which tells the output pixels each class
reaches; a pixel whose rounded (or floored: ``.long()``) value is none of the classes reaching
it is made up. Every op on the result continues its lineage; a sample's field of that lineage
that is integer (or floating with integer values: a soft target is meant to lie between) and
holds made-up pixels is told once per dataset (``label_map_averaged`` at the resize).

The wrapped ``collate_fn`` also shows the batch it returns (collate-reorders-fields): for a
collate of the script's, at the first ``_COLLATE_FETCHES`` fetches of a dataset, each row of each
batch tensor (a ``PackedSequence`` unpacked) is matched to the samples whose value it holds
(equal, a padded prefix along the first axis, the number; a sample's words or sentence that
the collate encodes, by the row's length without its padding or the length a field of lengths
holds); a field whose rows each name one sample gives an order, and another field whose rows do
not follow it (or, where no field names its samples one by one, a field out of the samples'
order that no one order of the samples fits together with a field in their order) is told once
per collate function (``collate_reordered``) that does not also return the permutation it applied (a
1-D integer field holding each row number once, which the model uses to undo the sort: the
rows are then matched on purpose), at the collate's line that sorts or permutes (read from its
source; the line that applies an order kept in a name), else its first line.

Costs: the mode's dispatch for every torch op in ``__getitem__`` during the looked-at fetches,
two extra small ops per geometric op, one resize per class for the first ``_LABEL_RESIZES``
averaging resizes of a label map; nothing afterwards.
"""

from __future__ import annotations

import inspect
import re
import weakref
from threading import get_ident

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence
from torch.overrides import TorchFunctionMode
from torch.utils.data._utils import fetch as _fetch

from .. import events as ev
from ..trace import Location
from .recorder import Recorder

FETCHES = 8  # batched fetches of one dataset looked at
_LEVELS = 16  # distinct values a mask holds at most
_MIN_SIDE = 4
_MIN_ROWS = 3  # samples of a batch whose collate is judged, at least
_COLLATE_ROWS = 64  # ... at most
_COLLATE_FETCHES = 2  # fetches of a dataset whose collate is judged, the first ones
_COLLATE_FIELDS = 6  # fields of a sample and of the batch compared, at most
_LIST_ITEMS = 4096  # a sample's list of numbers compared as a tensor, up to this length
_MAX_ELEMENTS = 1 << 22  # grids of a larger input are not followed
_AVERAGING = frozenset({"linear", "bilinear", "bicubic", "trilinear", "area"})
_LABEL_RESIZES = 32  # averaging resizes of label maps followed, at most
_LABEL_WORK = 1 << 24  # classes x pixels of a label map resized per class, at most
_MIN_CLASSES, _CLASSES = 3, 64  # values a label map holds (two: a binary mask's resize only
# moves its boundary)

# ops that move pixels, named as torch names the function or method; applied again to the grids
_GEOMETRIC = frozenset({
    "flip", "fliplr", "flipud", "rot90", "transpose", "swapaxes", "swapdims", "permute", "t",
    "__getitem__", "narrow", "roll", "pad", "interpolate", "upsample", "grid_sample",
    "movedim", "moveaxis", "select", "index_select", "unfold", "mT", "affine_grid",
    "resize", "center_crop", "crop",
})


def _name(func) -> str:
    name = getattr(func, "__name__", "") or ""
    if name == "__get__":  # a property (Tensor.mT, Tensor.T)
        name = getattr(getattr(func, "__self__", None), "__name__", "") or name
    return name


def _identity(shape) -> tuple:
    """Where each pixel of a tensor of that shape comes from: itself (rows, columns)."""
    H, W = int(shape[-2]), int(shape[-1])
    rows = torch.arange(H, dtype=torch.float32)[:, None].expand(H, W)
    cols = torch.arange(W, dtype=torch.float32)[None, :].expand(H, W)
    return rows, cols


class _Grids:
    """Where each pixel comes from. ``trailing``: axes after the two pixel axes (1 for a
    channels-last one-hot of a mask, whose pixel axes are (-3, -2) until it is permuted)."""
    __slots__ = ("rows", "cols", "ops", "trailing")

    def __init__(self, rows, cols, ops: tuple, trailing: int = 0):
        self.rows, self.cols, self.ops, self.trailing = rows, cols, ops, trailing


class _Mode(TorchFunctionMode):
    def __init__(self, watcher: "AugmentAlignWatcher"):
        super().__init__()
        self.watcher = watcher

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self.watcher.note(func, args, kwargs, out)
        except Exception as exc:
            self.watcher.broken(exc)
        return out


def label_map_values(source):
    """The values of a floating label map that an averaging resize makes up ids from:
    ``_MIN_CLASSES`` to ``_CLASSES`` integers, with the map's size times their number at most
    ``_LABEL_WORK``; or None."""
    if not isinstance(source, torch.Tensor) or not source.is_floating_point() \
            or source.requires_grad or source.dim() < 3 or source.numel() > _MAX_ELEMENTS:
        return None
    flat = source.detach().reshape(-1)
    head = flat[:256]
    if not bool(torch.equal(head, torch.round(head))):  # a feature map or an image: no unique
        return None
    values = torch.unique(flat)
    if not _MIN_CLASSES <= values.numel() <= _CLASSES \
            or not bool(torch.equal(values, torch.round(values))) \
            or values.numel() * source.numel() > _LABEL_WORK:
        return None
    return values


def averaging(args, kwargs) -> str | None:
    """The mode of an ``F.interpolate`` call when it averages neighbouring values (a linear,
    cubic or area mode, or ``antialias``), else None."""
    mode = kwargs.get("mode", args[3] if len(args) > 3 else "nearest")
    antialias = bool(kwargs.get("antialias", args[6] if len(args) > 6 else False))
    if isinstance(mode, str) and (mode in _AVERAGING or antialias):
        return mode
    return None


def made_up(func, source, args, kwargs, out, values) -> tuple:
    """For the resize ``out = func(source, *args[1:], **kwargs)`` of a label map holding
    ``values``: ((share of made-up pixels, their ids, the sum of the made values), ...) once
    rounded and once floored (a ``.long()`` cast). The resize is run again on each value's
    indicator (``source == v``), which tells the output pixels the value reaches; a pixel whose
    value is none of the values reaching it is made up."""
    result = out.detach()
    rounded, floored = torch.round(result), torch.floor(result)
    kept_r = torch.zeros(result.shape, dtype=torch.bool)
    kept_f = torch.zeros(result.shape, dtype=torch.bool)
    for level in values.tolist():
        indicator = (source.detach() == level).to(source.dtype)
        if args and args[0] is source:
            reach = func(indicator, *args[1:], **kwargs)
        else:
            reach = func(**{**kwargs, "input": indicator})
        reach = reach.detach().abs() > 1e-6
        kept_r |= reach & (rounded == level)
        kept_f |= reach & (floored == level)
    variants = []
    for made_of, kept in ((rounded, kept_r), (floored, kept_f)):
        made = ~kept
        new = sorted(int(v) for v in torch.unique(made_of[made]).tolist())[:_CLASSES]
        variants.append((float(made.float().mean()), new, float(made_of.double().sum())))
    return tuple(variants)


class AugmentAlignWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._fetches: dict[int, int] = {}  # id(dataset) -> batched fetches looked at
        self._told: set = set()
        self._grids: dict[int, tuple] = {}  # id(tensor) -> (tensor, _Grids), during one fetch
        # id(tensor) -> (tensor, the label map's values, op, mode, Location): the results of an
        # averaging resize of a label map and what is made from them, during one fetch
        self._averaged: dict[int, tuple] = {}
        self._told_labels: set = set()
        self._label_resizes = 0
        self._told_collates: set = set()  # code objects of the collate functions told
        self._failed = False

    def install(self, patcher) -> None:
        Fetcher = _fetch._MapDatasetFetcher
        patcher.patch(Fetcher, "fetch", self._wrap_fetch(Fetcher.fetch))

    def broken(self, exc) -> None:
        self._failed = True
        self.rec.internal_error("augmentation alignment", exc)

    def _wrap_fetch(self, original):
        watcher = self

        def fetch(fetcher, possibly_batched_index):
            samples: list = []
            dataset = getattr(fetcher, "dataset", None)
            looked = not watcher._failed and watcher._looks(fetcher, dataset)
            if not looked:
                return original(fetcher, possibly_batched_index)
            collate = fetcher.collate_fn

            def collate_seen(data):
                samples.append(data)
                out = collate(data)
                samples.append(out)
                return out

            watcher._grids, watcher._averaged = {}, {}
            try:
                fetcher.collate_fn = collate_seen
            except Exception as exc:
                watcher.broken(exc)
                return original(fetcher, possibly_batched_index)
            try:
                with _Mode(watcher):
                    data = original(fetcher, possibly_batched_index)
            finally:
                fetcher.collate_fn = collate
            try:
                if samples:
                    watcher._judge_labels(dataset, samples[0])
                    watcher._judge(dataset, samples[0])
                if len(samples) == 2:
                    watcher._judge_collate(dataset, collate, samples[0], samples[1])
            except Exception as exc:
                watcher.broken(exc)
            finally:
                watcher._grids, watcher._averaged = {}, {}
            return data

        fetch.__wrapped__ = original
        return fetch

    def _looks(self, fetcher, dataset) -> bool:
        if dataset is None or not getattr(fetcher, "auto_collation", False) \
                or get_ident() != self.rec.script_thread:
            return False
        count = self._fetches.get(id(dataset), 0)
        if count >= FETCHES:
            return False
        self._fetches[id(dataset)] = count + 1
        return True

    # -- inside the fetch ---------------------------------------------------------------------
    def _of(self, tensor):
        held = self._grids.get(id(tensor))
        return held[1] if held is not None and held[0] is tensor else None

    def note(self, func, args, kwargs, out) -> None:
        """An op run inside a looked-at fetch (the mode calls it): the grids of its result."""
        if isinstance(out, torch.Tensor):
            self._note_labels(func, args, kwargs, out)
        if not isinstance(out, torch.Tensor) or out.dim() < 2 or out.numel() > _MAX_ELEMENTS:
            return
        source = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("input")
        name = _name(func)
        if name == "one_hot" and isinstance(source, torch.Tensor) and source.dim() >= 2 \
                and tuple(out.shape[-3:-1]) == tuple(source.shape[-2:]):
            # a class axis appended after the pixels: the pixels keep their places, at (-3, -2)
            grids = self._of(source)
            rows, cols = (grids.rows, grids.cols) if grids is not None else _identity(source.shape)
            self._grids[id(out)] = (out, _Grids(rows, cols, grids.ops if grids else (), trailing=1))
            return
        if name in _GEOMETRIC and isinstance(source, torch.Tensor) and source.dim() >= 2:
            self._moved(func, name, source, args, kwargs, out)
            return
        # any other op keeps the grids of the input whose last two axes it keeps
        found = None
        for value in list(args[:4]) + list(kwargs.values()):
            if isinstance(value, (list, tuple)):
                value = value[0] if value and isinstance(value[0], torch.Tensor) else None
            if isinstance(value, torch.Tensor) and value.dim() >= 2 \
                    and tuple(value.shape[-2:]) == tuple(out.shape[-2:]):
                grids = self._of(value)
                if grids is not None:
                    found = grids
                    break
        if found is not None and out is not source:
            self._grids[id(out)] = (out, found)

    def _moved(self, func, name, source, args, kwargs, out) -> None:
        if source.numel() > _MAX_ELEMENTS:
            return
        grids = self._of(source)
        trailing = grids.trailing if grids is not None else 0
        rows, cols = (grids.rows, grids.cols) if grids is not None else _identity(source.shape)
        ops = grids.ops if grids is not None else ()
        if out is source or not args or args[0] is not source or "out" in kwargs:
            return
        results = []
        for grid in (rows, cols):
            # a channels-last one-hot: its pixel axes are followed by the class axis
            placed = grid[..., None].expand(source.shape) if trailing else grid.expand(source.shape)
            again = func(placed, *args[1:], **kwargs)
            if not isinstance(again, torch.Tensor) or again.dim() < 2 + trailing \
                    or tuple(again.shape[-2:]) != tuple(out.shape[-2:]):
                return  # the result's pixels cannot be placed: nothing is kept for it
            results.append(again)
        # the class axis still last (both grids constant along it), or moved in front of the
        # pixels (`one_hot(mask, C).permute(2, 0, 1)`: channels first, no pixel moved)
        keep = 1 if trailing and all(r.shape[-1] == source.shape[-1] and bool(torch.equal(
            r, r[..., :1].expand_as(r))) for r in results) else 0
        moved = [(r[(0,) * (r.dim() - 3)][..., 0] if keep else r[(0,) * (r.dim() - 2)]).detach()
                 for r in results]  # views: nothing copied
        same = moved[0].shape == rows.shape and bool(torch.equal(moved[0], rows)) \
            and bool(torch.equal(moved[1], cols))
        if not same:  # an op that moved pixels (not `images[i]`, `x[None]`): its line is kept
            # with the line that called the script's helper holding the op, if any (a crop
            # helper called once for the image and once for the mask: the calls differ)
            ops = ops + ((name, self.rec.here(), self.rec.caller_of()),)
        self._grids[id(out)] = (out, _Grids(moved[0], moved[1], ops, trailing=keep))

    def _note_labels(self, func, args, kwargs, out) -> None:
        """An averaging resize (``F.interpolate`` with a linear, cubic or area mode) of a label
        map — floating, integer values only, ``_MIN_CLASSES`` to ``_CLASSES`` of them — starts a
        lineage; any op on a tensor of a lineage (a round, a cast, an index) continues it."""
        source = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("input")
        if not isinstance(source, torch.Tensor):
            return
        held = self._averaged.get(id(source))
        if held is not None and held[0] is source:
            if out is not source:
                self._averaged[id(out)] = (out,) + held[1:]
            return
        name = _name(func)
        if name not in ("interpolate", "upsample") or self._label_resizes >= _LABEL_RESIZES:
            return
        mode = averaging(args, kwargs)
        if mode is None:
            return
        values = label_map_values(source)
        if values is None:
            return
        self._label_resizes += 1
        variants = made_up(func, source, args, kwargs, out, values)
        self._averaged[id(out)] = (out, frozenset(int(v) for v in values.tolist()), name, mode,
                                   self.rec.here(), variants)

    def _judge_labels(self, dataset, data) -> None:
        """A sample's integer field (or floating with integer values) made from an averaging
        resize of a label map and holding values that map does not: classes made up at the
        boundaries (a ``label_map_averaged`` event at the resize, once per dataset)."""
        if not self._averaged or id(dataset) in self._told_labels \
                or not isinstance(data, (list, tuple)):
            return
        for sample in data:
            fields = list(sample.items()) if isinstance(sample, dict) else \
                list(enumerate(sample)) if isinstance(sample, (list, tuple)) else []
            for key, value in fields:
                if not isinstance(value, torch.Tensor) or value.dim() < 2:
                    continue
                held = self._averaged.get(id(value))
                if held is None or held[0] is not value or value.dtype is torch.bool \
                        or value.is_complex():
                    continue
                flat = value.detach().reshape(-1)
                if value.is_floating_point() and not bool(torch.equal(flat, torch.round(flat))):
                    continue  # a soft target: values between the classes are meant
                levels = held[1]
                total = float(flat.double().sum())
                matching = [v for v in held[5] if abs(v[2] - total) < 0.5]
                share, new, _ = max(matching or held[5], key=lambda v: v[0])
                if share == 0 or not new:
                    continue
                self._told_labels.add(id(dataset))
                _, _, op, mode, line, _ = held
                self.rec.emit_aside(ev.label_map_averaged(
                    cls=type(dataset).__name__, field=_key(key), op=op, mode=mode,
                    levels=sorted(levels)[:_CLASSES], new=new[:_CLASSES],
                    share=round(share, 4), shape=[int(n) for n in value.shape[-2:]]), line)
                return

    # -- the collate's order: each field's rows against the samples ---------------------------
    def _judge_collate(self, dataset, collate, data, out) -> None:
        """A ``collate_fn`` of the script's whose batch holds one field's rows in another order
        of the samples than another field's (the sequences sorted by length, the labels not):
        a ``collate_reordered`` event at the line of the collate that reorders, once per
        collate function."""
        code = getattr(collate, "__code__", None)
        if code is None or code in self._told_collates or not isinstance(data, (list, tuple)) \
                or self._fetches.get(id(dataset), 0) > _COLLATE_FETCHES \
                or not _MIN_ROWS <= len(data) <= _COLLATE_ROWS \
                or not self.rec.finder.is_user_file(code.co_filename):
            return
        rows = len(data)
        samples = [list(s.values()) if isinstance(s, dict) else list(s) if isinstance(s, (list, tuple))
                   else [s] for s in data]
        width = len(samples[0])
        if width < 2 or any(len(s) != width for s in samples):
            return
        fields = list(out.items()) if isinstance(out, dict) else \
            list(enumerate(out)) if isinstance(out, (list, tuple)) else []
        orders = []  # (output field, sample field, the orders its rows allow: per row, a set)
        for key, value in fields[:_COLLATE_FIELDS]:
            if isinstance(value, PackedSequence):  # rows in the order packed
                value = pad_packed_sequence(value, batch_first=True)[0]
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or int(value.shape[0]) != rows:
                continue
            for k in range(min(width, _COLLATE_FIELDS)):
                allowed = _row_sources(value, [s[k] for s in samples])
                if allowed is not None:
                    orders.append((key, k, allowed))
                    break
            else:  # no field's values: a field of words the collate encodes, by its lengths
                for k in range(min(width, _COLLATE_FIELDS)):
                    allowed = _length_sources(value, [s[k] for s in samples])
                    if allowed is not None:
                        orders.append((key, k, allowed))
                        break
        unique = [(key, k, [next(iter(a)) for a in allowed]) for key, k, allowed in orders
                  if all(len(a) == 1 for a in allowed) and len({next(iter(a)) for a in allowed}) == rows]
        carried = _orders_returned(fields, rows)
        for key, k, perm in unique:
            for other, j, allowed in orders:
                if other == key or j == k:
                    continue
                if all(perm[r] in allowed[r] for r in range(rows)):
                    continue
                if any(all(p[r] == perm[r] for r in range(rows)) or all(p[r] in allowed[r] for r in range(rows))
                       for order in carried for p in (order, _inverse(order))):
                    continue  # the batch hands its reordering on, to be undone (sorted for
                    # packing, unsorted after the RNN): the rows are matched on purpose
                # the field out of the samples' order is the one reordered
                moved, kept = (key, other) if perm != list(range(rows)) else (other, key)
                self._told_collates.add(code)
                line = _unsorted_field_line(collate, kept) or _reordering_line(collate) \
                    or code.co_firstlineno
                loc = Location(path=self.rec.finder.display_path(code.co_filename), line=line,
                               function=code.co_name)
                self.rec.emit_aside(ev.collate_reordered(
                    collate=code.co_name, moved=_key(moved), kept=_key(kept), rows=rows,
                    displaced=sum(1 for r in range(rows) if perm[r] not in allowed[r])), loc)
                return
        # no field names its samples one by one (words encoded in the collate, matched by their
        # lengths; labels of a few classes): a field out of the samples' order is told when no
        # one order of the samples fits it and a field that is in their order
        for key, k, allowed in orders:
            if all(r in allowed[r] for r in range(rows)):
                continue
            for other, j, kept_allowed in orders:
                if other == key or j == k or not all(r in kept_allowed[r] for r in range(rows)):
                    continue
                if _matched([allowed[r] & kept_allowed[r] for r in range(rows)]) \
                        or any(all(p[r] in allowed[r] for r in range(rows))
                               for order in carried for p in (order, _inverse(order))):
                    continue  # one order fits both, or the batch hands its reordering on
                self._told_collates.add(code)
                line = _unsorted_field_line(collate, other) or _reordering_line(collate) \
                    or code.co_firstlineno
                loc = Location(path=self.rec.finder.display_path(code.co_filename), line=line,
                               function=code.co_name)
                self.rec.emit_aside(ev.collate_reordered(
                    collate=code.co_name, moved=_key(key), kept=_key(other), rows=rows,
                    displaced=sum(1 for r in range(rows) if r not in allowed[r])), loc)
                return

    # -- at the collate: the samples ----------------------------------------------------------
    def _judge(self, dataset, data) -> None:
        if id(dataset) in self._told or not isinstance(data, (list, tuple)):
            return
        for sample in data:
            fields = list(sample.items()) if isinstance(sample, dict) else \
                list(enumerate(sample)) if isinstance(sample, (list, tuple)) else []
            tensors = [(k, v) for k, v in fields if isinstance(v, torch.Tensor) and v.dim() >= 2
                       and min(v.shape[-2:]) >= _MIN_SIDE]
            images = [(k, v) for k, v in tensors if _image(v)]
            masks = [(k, v) for k, v in tensors if _mask(v)]
            for ik, image in images:
                for mk, mask in masks:
                    if tuple(image.shape[-2:]) != tuple(mask.shape[-2:]):
                        continue
                    found = self._differ(image, mask)
                    if found is None:
                        continue
                    self._told.add(id(dataset))
                    op, line, side = found
                    self.rec.emit_aside(ev.augment_misaligned(
                        cls=type(dataset).__name__, image=_key(ik), mask=_key(mk), op=op,
                        moved=side, shape=[int(n) for n in image.shape[-2:]]), line)
                    return

    def _differ(self, image, mask):
        """(op, its line, "image" or "mask") of the first op where the two were moved apart, or
        None when their pixels come from the same places."""
        a, b = self._of(image), self._of(mask)
        if a is None and b is None:
            return None
        ra, ca = (a.rows, a.cols) if a is not None else _identity(image.shape)
        rb, cb = (b.rows, b.cols) if b is not None else _identity(mask.shape)
        step = max(_step(ra, ca), _step(rb, cb), 1.0)
        gap = max(float((ra - rb).abs().max()), float((ca - cb).abs().max()))
        # a bilinear and a nearest resize of one size place a pixel up to half a step and
        # half a pixel apart (torch's nearest floors where bilinear centres)
        if gap < (0.5 if step <= 1.0 + 1e-6 else 0.5 * step + 0.5 + 1e-6):
            return None
        ops_a = a.ops if a is not None else ()
        ops_b = b.ops if b is not None else ()
        # the ops one of them went through and the other did not (the same line called from the
        # same place: the same op)
        only_b = [op for op in ops_b if op not in ops_a]
        only_a = [op for op in ops_a if op not in ops_b]
        if only_b:  # the mask moved another way (another axis, another offset): the mask's op
            return only_b[0][0], _line_of(only_b[0], ops_a), "mask"
        if only_a:
            return only_a[0][0], _line_of(only_a[0], ops_b), "image"
        # both moved by ops of one line (`x, m = x.flip(-1), m.flip(0)`): the mask's
        last = ops_b[-1] if ops_b else ops_a[-1] if ops_a else None
        return (last[0], last[1], "mask" if ops_b else "image") if last is not None else None


def _line_of(op, others):
    """The line to show for ``op``: its own, or, where the other tensor went through the same
    line of a helper called from elsewhere (a random crop drawn in a helper called twice), the
    line that called the helper for this one."""
    name, line, caller = op
    if caller is not None and any(o[0] == name and o[1] == line and o[2] != caller for o in others):
        return caller
    return line


def _as_tensor(value):
    """A sample's list of numbers (a tokenized sample's ``input_ids``, as a dataset of dicts
    holds it) as the 1-D tensor the collate makes of it; anything else as it is."""
    if isinstance(value, (list, tuple)) and 0 < len(value) <= _LIST_ITEMS \
            and all(type(v) in (int, float, bool) for v in value):
        return torch.tensor(value)
    return value


def _same(row, value) -> bool:
    """Whether a batch row holds a sample's value: equal, or its prefix along the first axis
    (a padded sequence), or the number of a scalar."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return row.dim() == 0 and bool(row == value)
        if value.dim() != row.dim() or tuple(value.shape[1:]) != tuple(row.shape[1:]) \
                or value.shape[0] > row.shape[0] or value.numel() == 0:
            return False
        return bool(torch.equal(row[: value.shape[0]].to(value.dtype), value))
    if isinstance(value, (bool, int, float)):  # compared in the batch's dtype (float32 labels)
        return row.dim() == 0 and bool(row == torch.tensor(value, dtype=row.dtype))
    return False


def _orders_returned(fields, rows: int) -> list[list[int]]:
    """The fields of a collated batch that are a reordering of its samples (a 1-D integer
    tensor holding ``0 .. rows - 1`` once each, not in order): the permutation a collate that
    sorts one field returns so that the model can undo it."""
    found = []
    for _key, value in fields[:_COLLATE_FIELDS]:
        if isinstance(value, torch.Tensor) and value.dim() == 1 and int(value.shape[0]) == rows \
                and not value.is_floating_point() and value.dtype != torch.bool:
            order = [int(v) for v in value.tolist()]
            if sorted(order) == list(range(rows)) and order != list(range(rows)):
                found.append(order)
    return found


def _inverse(order: list[int]) -> list[int]:
    inverse = [0] * len(order)
    for r, v in enumerate(order):
        inverse[v] = r
    return inverse


def _row_sources(batch, values) -> list | None:
    """For each row of ``batch``, the samples whose value it holds; None unless every row holds
    one and every sample is held by one (the field is made of those values, in some order)."""
    allowed = []
    values = [_as_tensor(v) for v in values]
    for r in range(int(batch.shape[0])):
        row = batch[r]
        allowed.append({s for s, v in enumerate(values) if _same(row, v)})
        if not allowed[-1]:
            return None
    if len(set().union(*allowed)) != len(values):
        return None
    return allowed


_LENGTH_OFFSETS = (0, 1, 2)  # tokens a collate adds to each sequence (a BOS, an EOS)


def _words(value) -> list[int] | None:
    """The lengths a sample's field of words can have once encoded: a list or tuple of strings
    (its length), a string (its words, its characters); None for anything else."""
    if isinstance(value, str):
        return [len(value.split()), len(value)]
    if isinstance(value, (list, tuple)) and 0 < len(value) <= _LIST_ITEMS \
            and all(isinstance(v, str) for v in value):
        return [len(value)]
    return None


def _row_lengths(batch) -> list[list[int]]:
    """The lengths a batch field's rows give its sequences: each row's number (a 1-D integer
    field of lengths), or the row with its padding cut (a 2-D integer field padded on the
    right, or on the left, with the value most of its rows end, or start, with)."""
    if batch.is_floating_point() or batch.is_complex() or batch.dtype == torch.bool:
        return []
    if batch.dim() == 1:
        return [[int(v) for v in batch.tolist()]]
    if batch.dim() != 2 or int(batch.shape[1]) == 0:
        return []
    found = []
    width = int(batch.shape[1])
    for end, positions in ((-1, torch.arange(1, width + 1)), (0, torch.arange(width, 0, -1))):
        values, counts = torch.unique(batch[:, end], return_counts=True)
        if int(counts.max()) * 2 < int(batch.shape[0]):
            continue
        keep = (batch != values[int(counts.argmax())]).int()
        # the farthest position from the padded end that is not padding
        found.append([int(v) for v in (keep * positions.expand_as(keep)).max(dim=1).values.tolist()])
    return found


def _length_sources(batch, values) -> list | None:
    """For each row of ``batch``, the samples whose field of words (strings the collate encodes)
    is as long as the row's sequence (or number); None unless the rows' lengths are the
    samples' lengths, one for one (give or take the tokens the collate adds to every row)."""
    lengths = [_words(v) for v in values]
    if any(n is None for n in lengths):
        return None
    for rows in _row_lengths(batch):
        for variant in range(len(lengths[0])):
            sample = [n[variant] for n in lengths]
            for offset in _LENGTH_OFFSETS:
                if sorted(r - offset for r in rows) != sorted(sample):
                    continue
                if len(set(sample)) < 2:
                    return None  # every sequence as long: nothing tells them apart
                return [{s for s, n in enumerate(sample) if n == r - offset} for r in rows]
    return None


def _matched(allowed: list[set]) -> bool:
    """Whether some order of the samples gives each row one of the samples it allows, each
    sample to one row (a perfect matching, by augmenting paths)."""
    owner: dict[int, int] = {}

    def place(r, seen) -> bool:
        for s in allowed[r]:
            if s in seen:
                continue
            seen.add(s)
            if s not in owner or place(owner[s], seen):
                owner[s] = r
                return True
        return False

    return all(place(r, set()) for r in range(len(allowed)))


_REORDERS = ("sorted(", ".sort(", "argsort(", "randperm(", "shuffle(", "reversed(", "[::-1]",
             ".flip(")


def _reordering_line(fn) -> int | None:
    """The first line of a function's source that reorders (sorts, permutes, reverses)."""
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    for i, text in enumerate(lines):
        code = text.split("#")[0]
        if any(r in code for r in _REORDERS):
            # an order kept in a name (``order = lengths.argsort()``): the line that applies it
            name = code.split("=")[0].strip() if "=" in code.split("(")[0] else ""
            if name.isidentifier():
                for j in range(i + 1, len(lines)):
                    if f"[{name}]" in lines[j].split("#")[0]:
                        return first + j
            return first + i
    return None


def _unsorted_field_line(fn, kept) -> int | None:
    """Where a collate that sorts its whole samples into a new list (``ordered =
    sorted(batch, ...)``) still builds field ``kept`` from the list it was given: the line
    after the sort that names both the collate's argument and the field (the bug's line, as
    the sort itself is right)."""
    try:
        lines, first = inspect.getsourcelines(fn)
        param = fn.__code__.co_varnames[0] if fn.__code__.co_argcount else None
    except (OSError, TypeError, AttributeError):
        return None
    if not param or not isinstance(kept, str) or not kept.isidentifier():
        return None
    sort = re.compile(r"^\s*(\w+)\s*=\s*sorted\(\s*" + re.escape(param) + r"\b")
    uses, field = re.compile(r"\b" + re.escape(param) + r"\b"), re.compile(r"\b" + re.escape(kept) + r"\b")
    for i, text in enumerate(lines):
        found = sort.match(text.split("#")[0])
        if found is None:
            continue
        ordered = re.compile(r"\b" + re.escape(found.group(1)) + r"\b")
        for j in range(i + 1, len(lines)):
            code = lines[j].split("#")[0]
            if uses.search(code) and field.search(code) and not ordered.search(code):
                return first + j
        return None
    return None


def _step(rows, cols) -> float:
    """Source pixels per output pixel (a resize's scale): the largest mean change of either
    grid along either axis (a rotation swaps which grid changes along which axis)."""
    steps = [0.0]
    for grid in (rows, cols):
        if grid.shape[0] > 1:
            steps.append(float((grid[1:, :] - grid[:-1, :]).abs().mean()))
        if grid.shape[1] > 1:
            steps.append(float((grid[:, 1:] - grid[:, :-1]).abs().mean()))
    return max(steps)


def _levels(t) -> int:
    flat = t.detach().reshape(-1)
    if flat.numel() > 1 << 16:
        flat = flat[: 1 << 16]
    return int(torch.unique(flat).numel())


def _image(t) -> bool:
    return t.is_floating_point() and _levels(t) > _LEVELS


def _mask(t) -> bool:
    """Integer, boolean or few-valued floating, and not constant (a constant mask labels every
    place alike: moving it changes nothing)."""
    if t.is_complex():
        return False
    levels = _levels(t)
    if t.dtype == torch.bool or not t.is_floating_point():
        return levels >= 2
    return 2 <= levels <= _LEVELS


def _key(k):
    return k if isinstance(k, (int, str)) else str(k)
