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

Costs: the mode's dispatch for every torch op in ``__getitem__`` during the looked-at fetches,
two extra small ops per geometric op; nothing afterwards.
"""

from __future__ import annotations

import weakref
from threading import get_ident

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.data._utils import fetch as _fetch

from .. import events as ev
from .recorder import Recorder

FETCHES = 8  # batched fetches of one dataset looked at
_LEVELS = 16  # distinct values a mask holds at most
_MIN_SIDE = 4
_MAX_ELEMENTS = 1 << 22  # grids of a larger input are not followed

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
    __slots__ = ("rows", "cols", "ops")

    def __init__(self, rows, cols, ops: tuple):
        self.rows, self.cols, self.ops = rows, cols, ops


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


class AugmentAlignWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._fetches: dict[int, int] = {}  # id(dataset) -> batched fetches looked at
        self._told: set = set()
        self._grids: dict[int, tuple] = {}  # id(tensor) -> (tensor, _Grids), during one fetch
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
                return collate(data)

            watcher._grids = {}
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
                    watcher._judge(dataset, samples[0])
            except Exception as exc:
                watcher.broken(exc)
            finally:
                watcher._grids = {}
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
        if not isinstance(out, torch.Tensor) or out.dim() < 2 or out.numel() > _MAX_ELEMENTS:
            return
        source = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("input")
        name = _name(func)
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
        rows, cols = (grids.rows, grids.cols) if grids is not None else _identity(source.shape)
        ops = grids.ops if grids is not None else ()
        if out is source or not args or args[0] is not source or "out" in kwargs:
            return
        moved = []
        for grid in (rows, cols):
            again = func(grid.expand(source.shape), *args[1:], **kwargs)
            if not isinstance(again, torch.Tensor) or again.dim() < 2 \
                    or tuple(again.shape[-2:]) != tuple(out.shape[-2:]):
                return  # the result's pixels cannot be placed: nothing is kept for it
            moved.append(again[(0,) * (again.dim() - 2)].detach())  # a view: nothing copied
        same = moved[0].shape == rows.shape and bool(torch.equal(moved[0], rows)) \
            and bool(torch.equal(moved[1], cols))
        if not same:  # an op that moved pixels (not `images[i]`, `x[None]`): its line is kept
            ops = ops + ((name, self.rec.here()),)
        self._grids[id(out)] = (out, _Grids(moved[0], moved[1], ops))

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
        # the ops one of them went through and the other did not (the same line: the same op)
        only_b = [op for op in ops_b if op not in ops_a]
        only_a = [op for op in ops_a if op not in ops_b]
        if only_b:  # the mask moved another way (another axis, another offset): the mask's op
            return only_b[0][0], only_b[0][1], "mask"
        if only_a:
            return only_a[0][0], only_a[0][1], "image"
        # both moved by ops of one line (`x, m = x.flip(-1), m.flip(0)`): the mask's
        last = ops_b[-1] if ops_b else ops_a[-1] if ops_a else None
        return (last[0], last[1], "mask" if ops_b else "image") if last is not None else None


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
