"""A batch and its dense target flipped along different axes in the training loop
(augmentation-misaligned, the loop's form).

Dense prediction often augments whole batches in the loop rather than in the Dataset:
``if random() < 0.5: img = img.flip(-1); depth = depth.flip(-1)``. The input and its target
(a depth map, a segmentation mask, a flow field) must be flipped along the same image axis;
flipped along another (``depth.flip(-2)``), every flipped batch pairs each pixel with the
target of a pixel mirrored the other way. Nothing fails.

What the run observes: ``torch.flip``, ``Tensor.flip``, ``fliplr`` and ``flipud`` are wrapped
(``watched_call``) in the script's thread, with gradients enabled, on tensors without a
gradient (data, not a model's features), until ``WINDOW`` backwards have run. Each call's output
is kept until the next backward with the axes it flipped, counted from the end (axis -1: width,
-2: height; ``dim - ndim`` for a positive one), and the flip whose output it flipped, if any. At
a backward (``describe_loss``) the loss's graph is searched (``_READS`` nodes) for the layers'
saved inputs (a convolution's ``input``, a matrix product's ``mat1``/``self``): a flip whose
output, or an output flipped from it, is read there moves the model's *input*. A flip of
another tensor of the same last two axes, nothing flipped from which a layer reads, is paired
with the nearest flip of the input (within ``_PAIRED`` calls, the one before first: the two
calls of one augmentation, ``img = img.flip(-1); depth = depth.flip(-1)``); when the two flip
other image axes: one ``augment_misaligned`` aside event (``cls`` "": the loop's; ``image`` and
``mask`` the lines and axes of the two flips), at the target's flip, once per line. Two views of
one image flipped apart for a contrastive loss are both read by the model: not judged; a
target not flipped at all is not judged either (a flow field is flipped and negated: what is
flipped after the negation starts afresh, and is paired call by call all the same).

Costs: one Python call per flip in the script's thread during the first ``WINDOW`` backwards'
turns, and a walk of the loss graph's first ``_READS`` nodes at those backwards; nothing after.
"""

from __future__ import annotations

from threading import get_ident

import torch

from .. import events as ev
from .graphpaths import nodes_below, saved
from .inlinable import watched_call
from .lossterms import loss_root
from .patcher import put_back
from .recorder import Recorder
from .topics import DESCRIBE_LOSS

WINDOW = 8  # backwards whose turns' flips are judged
_PER_TURN = 32  # flips kept per turn, at most
_READS = 4096  # graph nodes searched for the layers' saved inputs, at most
_SAVED_INPUTS = ("_saved_input", "_saved_mat1", "_saved_self")
_LAYERS = ("Convolution", "Addmm", "Mm", "Bmm")
_LABEL = "flip alignment"
_PAIRED = 2  # flip calls between a target's flip and its input's, at most


def _axes(name: str, tensor: torch.Tensor, args, kwargs) -> frozenset | None:
    """The axes a flip call flips, counted from the end, or None."""
    ndim = tensor.dim()
    if name == "fliplr":
        dims = [1]
    elif name == "flipud":
        dims = [0]
    else:
        dims = kwargs.get("dims", args[1:] if len(args) > 1 else None)
        if dims is None:
            return None
        if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
            dims = dims[0]
        if isinstance(dims, int):
            dims = [dims]
    out = set()
    for d in dims:
        if not isinstance(d, int) or not -ndim <= d < ndim:
            return None
        out.add(d - ndim if d >= 0 else d)
    return frozenset(out)


class _Flip:
    __slots__ = ("out", "parent", "axes", "loc")

    def __init__(self, out, parent, axes, loc):
        self.out, self.parent, self.axes, self.loc = out, parent, axes, loc


def layer_inputs(root) -> set:
    """``(data_ptr, numel)`` of the tensors the layers below ``root`` saved as their input."""
    found = set()
    nodes, _ = nodes_below([root], _READS)
    for node in nodes:
        if not type(node).__name__.startswith(_LAYERS):
            continue
        for attr in _SAVED_INPUTS:
            value = saved(node, attr)
            if isinstance(value, torch.Tensor):
                found.add((value.data_ptr(), value.numel()))
    return found


_IMAGE_AXES = frozenset({-1, -2})


def misaligned(flips: list, inputs: set):
    """``(input's flip, target's flip)``: a flip of a tensor no layer reads (nor anything flipped
    from it), of the same last two axes as a tensor a layer reads, whose image axes differ from
    those of the nearest flip (within ``_PAIRED`` calls, the one before first) of the input's
    lineage: the two calls of one paired augmentation moving the two apart; or None."""
    feeds = [False] * len(flips)  # the flip's output, or one flipped from it, is read
    shapes = set()
    for i, f in enumerate(flips):
        if (f.out.data_ptr(), f.out.numel()) in inputs and f.out.dim() >= 2:
            shapes.add(tuple(f.out.shape[-2:]))
            j = i
            while j is not None and not feeds[j]:
                feeds[j] = True
                j = flips[j].parent
    if not shapes:
        return None
    for i, f in enumerate(flips):
        if feeds[i] or f.out.dim() < 2 or tuple(f.out.shape[-2:]) not in shapes:
            continue
        near = [j for j in (*range(i - 1, i - _PAIRED - 1, -1), *range(i + 1, i + _PAIRED + 1)) if 0 <= j < len(flips) and feeds[j]]
        if not near:
            continue
        source = flips[near[0]]
        if source.out.dim() >= 2 and tuple(source.out.shape[-2:]) == tuple(f.out.shape[-2:]) \
                and (source.axes & _IMAGE_AXES) != (f.axes & _IMAGE_AXES):
            return source, f
    return None


class FlipAlignWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._open = True
        self._backwards = 0
        self._flips: list = []
        self._told: set = set()
        self._restore: list = []

    def install(self, patcher) -> None:
        for owner, name in ((torch, "flip"), (torch.Tensor, "flip"), (torch, "fliplr"),
                            (torch.Tensor, "fliplr"), (torch, "flipud"), (torch.Tensor, "flipud")):
            original = getattr(owner, name, None)
            if original is None:
                continue
            wrapper = patcher.patch(owner, name, watched_call(original, self._after(name)))
            self._restore.append((owner, name, original, wrapper))

    def _after(self, name: str):
        def after(args, kwargs, result) -> None:
            if not self._open or not args or not torch.is_grad_enabled():
                return
            t = args[0]
            if not isinstance(t, torch.Tensor) or not isinstance(result, torch.Tensor) \
                    or t.requires_grad or get_ident() != self.rec.script_thread \
                    or len(self._flips) >= _PER_TURN:
                return
            try:
                axes = _axes(name, t, args, kwargs or {})
                if axes is None:
                    return
                parent = None
                for index, f in enumerate(self._flips):
                    if f.out is result:
                        return  # the same call seen again (a mode dispatching it once more)
                    if f.out is t:  # a flip of a flip's output: the same lineage
                        parent = index
                self._flips.append(_Flip(result, parent, axes, self.rec.here()))
            except Exception as exc:
                self._close()
                self.rec.internal_error(_LABEL, exc)
        return after

    def describe_loss(self, tensors) -> dict:
        if not self._open:
            return {}
        self._backwards += 1
        flips, self._flips = self._flips, []
        try:
            if len(flips) >= 2:
                root = loss_root(tensors)
                found = misaligned(flips, layer_inputs(root)) if root is not None else None
                if found is not None and found[1].loc is not None and found[1].loc not in self._told:
                    source, target = found
                    self._told.add(target.loc)
                    self.rec.emit_aside(ev.augment_misaligned(
                        cls="", image={"line": getattr(source.loc, "line", None), "axes": sorted(source.axes)},
                        mask={"line": getattr(target.loc, "line", None), "axes": sorted(target.axes)},
                        op="flip", moved="mask", shape=[int(s) for s in target.out.shape[-2:]]),
                        target.loc)
        except Exception as exc:
            self.rec.internal_error(_LABEL, exc)
            self._close()
        if self._backwards >= WINDOW:
            self._close()
        return {}

    def _close(self) -> None:
        if not self._open:
            return
        self._open = False
        self._flips = []
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        for owner, name, original, wrapper in self._restore:
            try:  # not from under another watcher's wrapper
                put_back(owner, name, original, wrapper)
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)
