"""Regression targets that hold a fill value where there is nothing to regress
(placeholder-targets-trained).

Dense prediction builds its regression targets as a canvas and fills in the entries that have
one: an anchor-based detector writes box offsets into ``torch.zeros(num_anchors, 4)`` for the
anchors matched to an object, a pose model writes the visible keypoints' coordinates, a depth
or flow map from a sparse sensor leaves 0 where there was no return. The loss must then be
taken over the filled entries only (``smooth_l1_loss(pred[pos], target[pos])``, or a mask that
divides by its count); written over the whole canvas, the model is also trained to predict the
fill value for every background anchor, invisible keypoint or missing pixel: the box head
learns "no offset" from the majority of anchors, the depth head learns that much of the scene
is at distance 0. Nothing fails, and the loss goes down.

What is judged: among the first ``_CALLS`` calls with a gradient of the wrapped losses, those of
the regression losses
(``mse_loss``, ``l1_loss``, ``smooth_l1_loss``, ``huber_loss``; ``losses.py`` tells them through
``LossCalls``) whose input and target have one shape, whose reduction sums or averages every
element (``reduction="none"`` leaves the script a mask to apply afterwards, a ``weight`` is one) and whose target is a
CPU float tensor without gradient (a device's only before the first step: no host sync after it):

* ``rows``: a target of rows of 2 to 8 coordinates (boxes, keypoints, offsets) and at least
  ``_MIN_ROWS`` rows, of which ``_LOW`` or more are entirely 0 (``_MIN_FILLED`` at least not),
  the others not all integers (counts, returns of 0/1 rewards: 0 is a value there) while under ``_ZERO_IN_ROWS``
  of the other rows' values are 0: the zero rows are filler, not coordinates that happen to be
  0;
* ``sparse``: a map of at least three axes (N, [C,] H, W) with no negative value, ``_LOW`` or
  more of its values exactly 0 (not all), the others not integers (a count is legitimately 0) and all
  at least ``_GAP`` of the largest: zeros that stand apart from the measured values (missing
  depth), not the low end of a continuum (dark pixels, no rain).

* ``padded``: a batch of sequences of frames, (B, T, F) or (B, F, T) with F of 2 or more (a
  mel-spectrogram, features per frame), whose rows end in a run of all-zero frames, of at least
  two lengths, in ``_MIN_PADDED`` rows or more (``_LOW`` of them at least) and
  ``_PAD_SHARE`` of the frames, with almost no zero frame before a row's end, while the
  prediction is not all 0 there too: the padding of a variable-length batch, which the loss
  trains the model to predict (a TTS decoder's mel frames past each utterance's end).

One ``placeholder_targets`` aside event per call line (loc: the loss call).

Rows of three values in [0, 1] whose prediction lies in [0, 1] too are colours (a NeRF's rays
over a black background: a black ray is a colour), not a canvas of coordinates: left out.

A colour image the prediction was computed from is left out: an autoencoder (a slot-attention or
VAE reconstruction of images of objects on a black background) reconstructs its own input,
whose zeros are black pixels like the others' colours. A one- or two-channel map the model reads
and is trained to give back (a sparse depth map as both input and target) is still told: its
zeros are missing returns the model learns to repeat. Told by the prediction's graph (``_READS``
nodes, breadth first): a layer's saved input (a convolution's ``input``, a matrix product's
``mat1``/``self``) that is the target's values in its memory, through views only (two
slices of one dataset tensor, an image and its depth, are different memory).

A loss written by hand reads the same canvas through a log (the scale-invariant depth loss,
``torch.log(pred) - torch.log(gt)``): ``torch.log`` and ``Tensor.log`` are wrapped until
``_LOG_CALLS`` calls on a tensor without gradient have been judged or ``WINDOW`` backwards have
run, then put back; a ``sparse`` map among their inputs is told the same way (``fn`` "log":
log(0) is -inf, and the loss and its gradients are inf or NaN from the first step).
"""

from __future__ import annotations

from threading import get_ident

import torch

from .. import events as ev
from .graphpaths import nodes_below, saved
from .inlinable import watched
from .recorder import Recorder
from .topics import DESCRIBE_LOSS
from .patcher import put_back

_CALLS = 16  # loss calls with a gradient heard (of every wrapped loss: it closes in a run of
# classification losses too), at most
_FNS = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
_MIN_ROWS = 8
_LOW = 0.2  # share of placeholder rows (or values) judged, at least
_MIN_FILLED = 2  # filled rows (or values), at least: a detector matches well under 1% of anchors
_ZERO_IN_ROWS = 0.05  # share of zeros among the values of the filled rows, at most
_GAP = 0.01  # the filled values of a sparse map are at least this share of its largest
_MAX_VALUES = 1 << 22  # values of a target read, at most
_MIN_PADDED = 2  # rows of a padded batch that end in padding, at least
_PAD_SHARE = 0.05  # share of a padded batch's frames that are padding, at least
_LOG_CALLS = 16  # log calls on a tensor without gradient judged, at most
WINDOW = 3  # backwards after which the log wrappers are put back
_READS = 4096  # graph nodes of the prediction searched for the target read as an input, at most
_SAVED_INPUTS = ("_saved_input", "_saved_mat1", "_saved_self")


def _reduction(fn: str, kwargs, args) -> str:
    """The reduction a regression loss call asks for ("masked" when it is given a per-element
    ``weight``: a mask the script applies through the loss)."""
    if kwargs.get("weight") is not None or (fn in ("mse_loss", "l1_loss") and len(args) > 5
                                           and args[5] is not None):
        return "masked"
    if fn == "huber_loss":
        return str(kwargs.get("reduction", args[2] if len(args) > 2 else "mean"))
    if "reduction" in kwargs:
        return str(kwargs["reduction"])
    if len(args) > 4 and isinstance(args[4], str):
        return args[4]
    if kwargs.get("reduce") is False or (len(args) > 3 and args[3] is False):
        return "none"
    return "mean"


def judge_targets(target: torch.Tensor) -> dict | None:
    """The placeholder fault of ``target`` (the event's data but fn), or None."""
    if not target.is_floating_point() or target.requires_grad or target.dim() < 2 \
            or target.numel() > _MAX_VALUES or target.numel() == 0:
        return None
    with torch.no_grad():
        t = target.detach()
        width = int(t.shape[-1])
        if 2 <= width <= 8 and t.numel() // width >= _MIN_ROWS:
            rows = t.reshape(-1, width)
            zero = rows == 0
            empty = zero.all(1)
            share, zeros_inside = torch.stack([
                empty.float().mean(),
                (zero & ~empty[:, None]).float().sum() / ((~empty).sum() * width).clamp(min=1)
            ]).tolist()
            filled = int(rows.shape[0] - round(share * rows.shape[0]))
            kept = rows[~empty]
            if share >= _LOW and filled >= _MIN_FILLED and zeros_inside < _ZERO_IN_ROWS \
                    and not bool(torch.equal(kept, torch.round(kept))):  # counts: 0 is a value
                return {"how": "rows", "share": round(share, 4), "rows": int(rows.shape[0]),
                        "width": width, "low": round(float(kept.min()), 6),
                        "high": round(float(kept.max()), 6)}
        if t.dim() < 3:
            return None
        flat = t.reshape(-1).float()
        zero = flat == 0
        share = float(zero.float().mean())
        kept = flat[~zero]
        if share < _LOW or kept.numel() < _MIN_FILLED:
            return None
        low, high = (float(v) for v in torch.aminmax(kept))
        if low < 0 or not high > 0 or low < _GAP * high:
            return None
        if bool(torch.equal(kept, torch.round(kept))):
            return None  # counts: 0 is a value like the others
        return {"how": "sparse", "share": round(share, 4), "rows": int(flat.numel()),
                "width": 1, "low": round(low, 6), "high": round(high, 6)}


def judge_padding(input: torch.Tensor, target: torch.Tensor) -> dict | None:
    """``padded``: a batch of sequences of frames, (B, T, F) or (B, F, T), whose rows end in a
    run of all-zero frames of varying length (the padding of a variable-length batch) with
    almost no zero frame before it, while the prediction is not zero there too (a prediction
    masked to 0 at the padding, Tacotron 2's ``masked_fill``, adds nothing there)."""
    if not target.is_floating_point() or target.requires_grad or target.dim() != 3 \
            or target.numel() > _MAX_VALUES or target.shape[0] < _MIN_PADDED:
        return None
    with torch.no_grad():
        t, x = target.detach(), input.detach()
        for time_axis in (1, 2):
            frames = int(t.shape[time_axis])
            width = int(t.shape[3 - time_axis])
            if frames < 4 or width < 2:
                continue
            empty = (t == 0).all(dim=3 - time_axis)  # (B, T): frames that are all 0
            # each row's real length: the frames before its trailing run of empty frames
            filled = (~empty).int()
            last = torch.where(filled.any(1), frames - filled.flip(1).argmax(1), torch.zeros_like(filled[:, 0]))
            inside = torch.arange(frames, device=t.device)[None, :] < last[:, None]
            padded_rows = int((last < frames).sum())
            lengths = last[last > 0]
            if padded_rows < _MIN_PADDED or padded_rows < _LOW * t.shape[0] \
                    or lengths.numel() < t.shape[0] or int(lengths.unique().numel()) < 2:
                continue
            pad_share = float((~inside).float().mean())
            holes = float((empty & inside).float().sum() / inside.float().sum().clamp(min=1))
            if pad_share < _PAD_SHARE or holes > _ZERO_IN_ROWS:
                continue
            pad = (~inside).unsqueeze(3 - time_axis).expand_as(t)
            if bool((x[pad] == 0).all()):
                return None  # the prediction is masked at the padding too
            return {"how": "padded", "share": round(pad_share, 4), "rows": padded_rows,
                    "width": width, "low": int(lengths.min()), "high": int(lengths.max())}
    return None


def masked_alike(input: torch.Tensor, target: torch.Tensor) -> bool:
    """The prediction is exactly 0 wherever the target is: one mask (a keypoint's target weight,
    `F.mse_loss(pred * w, target * w)`) multiplied into both, so those entries add nothing."""
    with torch.no_grad():
        return bool((input.detach()[target.detach() == 0] == 0).all())


def is_colour(target: torch.Tensor) -> bool:
    """A batch of colour images: 3 or 4 channels on axis 1 (N, C, H, W) or last (N, H, W, C)."""
    return target.dim() == 4 and (target.shape[1] in (3, 4) or target.shape[-1] in (3, 4))


def is_colour_rows(input: torch.Tensor, target: torch.Tensor) -> bool:
    """Rows of red, green and blue in [0, 1] predicted in [0, 1] too: pixels or rays' colours
    (a NeRF's batch of rays over a black background, whose black rows are colours like the
    others), not coordinates. A colour head bounds its output as its targets are bounded (a
    sigmoid, alpha-composited); a box, offset or keypoint head's output is not bounded so."""
    if target.dim() < 2 or int(target.shape[-1]) != 3 or not input.is_floating_point():
        return False
    with torch.no_grad():
        low, high = (float(v) for v in torch.aminmax(target.detach()))
        plow, phigh = (float(v) for v in torch.aminmax(input.detach()))
    return 0.0 <= low and high <= 1.0 and 0.0 <= plow and phigh <= 1.0


def reads_target(input: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether a layer below ``input`` (the prediction) read the memory ``target`` lies in: the
    target is what the model was given (a reconstruction), not a canvas filled in for it."""
    root = input.grad_fn
    if root is None:
        return False
    where, size = target.data_ptr(), target.numel()
    nodes, _ = nodes_below([root], _READS)
    for node in nodes:
        name = type(node).__name__
        if not (name.startswith("Convolution") or name.startswith("Addmm")
                or name.startswith("Mm") or name.startswith("Bmm")):
            continue
        for attr in _SAVED_INPUTS:
            value = saved(node, attr)
            if isinstance(value, torch.Tensor):
                if value.data_ptr() == where and value.numel() == size:
                    return True  # the same values, through views (a flatten) or none
    return False


class PlaceholderTargetWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._calls = 0
        self._told: set = set()

    @property
    def open(self) -> bool:
        return self._calls < _CALLS

    def loss_call(self, fn: str, input, target, args, kwargs) -> None:
        self._calls += 1
        if fn not in _FNS or not isinstance(target, torch.Tensor) \
                or not isinstance(input, torch.Tensor) or input.shape != target.shape:
            return
        if target.device.type != "cpu" and self.rec.progress.steps:
            return
        try:
            if _reduction(fn, kwargs or {}, args or ()) in ("none", "masked"):
                return
            found = judge_targets(target)
            if found is None:
                found = judge_padding(input, target)
            if found is None or (found["how"] == "sparse" and is_colour(target)
                                 and reads_target(input, target)):
                return
            if found["how"] == "rows" and is_colour_rows(input, target):
                return
            if found["how"] != "padded" and masked_alike(input, target):
                return
            loc = self.rec.here()
            if loc in self._told:
                return
            self._told.add(loc)
            self.rec.emit_aside(ev.placeholder_targets(fn=fn, shape=[int(s) for s in target.shape],
                                                       **found), loc)
        except Exception as exc:
            self._calls = _CALLS
            self.rec.internal_error("placeholder targets", exc)


class LogTargetWatcher:
    """``torch.log`` / ``Tensor.log`` of a target map whose zeros stand for missing values."""

    def __init__(self, rec: Recorder):
        self.rec = rec
        self._open = True
        self._calls = 0
        self._backwards = 0
        self._told: set = set()
        self._restore: list = []

    def install(self, patcher) -> None:
        for owner, name in ((torch, "log"), (torch.Tensor, "log")):
            original = getattr(owner, name, None)
            if original is None:
                continue
            wrapper = patcher.patch(owner, name, watched(original, self._before))
            self._restore.append((owner, name, original, wrapper))

    def _before(self, args, kwargs) -> None:
        if not self._open or not args or not torch.is_grad_enabled():
            return
        t = args[0]
        if not isinstance(t, torch.Tensor) or t.requires_grad or not t.is_floating_point() \
                or t.dim() < 3 or get_ident() != self.rec.script_thread:
            return
        if t.device.type != "cpu" and self.rec.progress.steps:
            return
        try:
            self._calls += 1
            if self._calls > _LOG_CALLS:
                self._close()
                return
            found = judge_targets(t)
            if found is None or found["how"] != "sparse":
                return
            loc = self.rec.here()
            if loc in self._told:
                return
            self._told.add(loc)
            self.rec.emit_aside(ev.placeholder_targets(fn="log", shape=[int(s) for s in t.shape],
                                                       **found), loc)
        except Exception as exc:
            self._close()
            self.rec.internal_error("placeholder targets (log)", exc)

    def describe_loss(self, tensors) -> dict:
        """``DESCRIBE_LOSS``: the wrappers are put back after ``WINDOW`` backwards."""
        self._backwards += 1
        if self._open and self._backwards >= WINDOW:
            self._close()
        return {}

    def _close(self) -> None:
        if not self._open:
            return
        self._open = False
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        for owner, name, original, wrapper in self._restore:
            try:  # not from under another watcher's wrapper
                put_back(owner, name, original, wrapper)
            except Exception as exc:
                self.rec.internal_error("placeholder targets (log)", exc)
