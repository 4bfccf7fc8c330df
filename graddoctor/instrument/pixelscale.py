"""Image batches that reach the model as raw 8-bit pixel values, never scaled (pixels-not-scaled).

A uint8 image made float (``.float()``, ``.to(torch.float32)``) keeps its values 0..255. Every
pretrained network, every initialisation scheme and every learning rate chosen for images
assumes inputs of order 1 (``/ 255``, then often a mean and std): raw pixels make the first
layer's activations and gradients a few hundred times larger, so the run trains (the loss even
goes down) towards a worse model, and a pretrained backbone sees inputs it was never trained on.

Seen where the batch enters a layer: global forward pre-hooks (removed after the window) look at
the first input of each ``nn.Conv2d``/``nn.Conv3d``, and of each ``nn.Linear`` at least
``_MIN_WIDTH`` wide (flattened images), at the first training forwards (grad enabled, the
script's thread). Only an input with no graph is a batch from the data (a layer deeper in the
model gets activations that carry one); it counts as raw pixels when it is floating point, every
value an integer in [0, 255], the largest above ``_MIN_HIGH`` and at least ``_MIN_OVER`` of them
above ``_MIN_HIGH`` (an image's intensities, not a sparse count vector). One ``aminmax``, one
comparison with its rounding and one mean per input looked at, at most ``_READS`` inputs, CPU
tensors (on a device only before the first optimizer step: no host sync after it). Once found:
a ``pixels_unscaled`` aside at the user's line that ran the layer, once per run.

The same look finds an image divided by 255 twice (``ToTensor()`` already gives 0..1, and the
loop divides again): every value within ±1/255 and spread over half of that range at least, a
``pixels_scaled_twice`` aside.

Silent: pixels divided by 255 once (in the dataset, the loop or the model's forward), normalised
ones; small integer codes (board positions, masks, class ids: nothing above ``_MIN_HIGH``);
token ids (an embedding takes them, not a layer watched here); raw integer features (age,
counts) in a narrow ``Linear``; layers after the first (their input has a graph).
"""

from __future__ import annotations

from threading import get_ident

import torch
from torch import nn

from .. import events as ev
from .dependency import close_before_compile, register_module_hooks
from .recorder import Recorder
from .topics import STEPPED

WINDOW = 3  # optimizer steps (or backwards) watched, from the first one
_READS = 16  # inputs whose values are read at most
_MIN_HIGH = 32.0  # raw pixels reach well past this; masks, codes and board states do not
_MIN_OVER = 0.05  # share of the values above _MIN_HIGH: an image's, not a sparse count vector's
_MIN_WIDTH = 64  # a Linear this wide over raw integers takes a flattened image
_WATCHED = (nn.Conv2d, nn.Conv3d, nn.Linear)
_TWICE = 1 / 255  # the largest value of an 8-bit image divided by 255 twice
_MIN_VALUES = 256  # values an image batch has at least
_MIN_SPREAD = 0.25  # share of them past a quarter of 1/255


def raw_pixels(x: torch.Tensor) -> tuple[float, float, float] | None:
    """``(low, high, share above _MIN_HIGH)`` when ``x`` holds 8-bit pixel values unscaled:
    floating point, every value an integer in [0, 255], reaching past ``_MIN_HIGH`` in at least
    ``_MIN_OVER`` of its values; else None."""
    if not x.is_floating_point() or x.numel() == 0:
        return None
    with torch.no_grad():
        low, high = (float(v) for v in torch.aminmax(x))
        if low < 0 or high > 255 or high <= _MIN_HIGH:
            return None
        if not bool(torch.equal(x, torch.round(x))):
            return None
        over = float((x > _MIN_HIGH).float().mean())
    return (low, high, over) if over >= _MIN_OVER else None


def scaled_twice(x: torch.Tensor) -> tuple[float, float] | None:
    """``(low, high)`` when ``x`` looks like an image divided by 255 twice: floating point, at
    least ``_MIN_VALUES`` values, every one within ±1/255, spread over more than half of that
    range and a quarter of them past a quarter of it (an 8-bit image's 0..1, or -1..1, scaled
    down once more); else None."""
    if not x.is_floating_point() or x.numel() < _MIN_VALUES:
        return None
    with torch.no_grad():
        low, high = (float(v) for v in torch.aminmax(x))
    bound = _TWICE * 1.001
    if low < -bound or high > bound or high - low < 0.5 * _TWICE:
        return None
    with torch.no_grad():  # intensities over the range, not a sparse map of a few values
        spread = float((x.abs() > 0.25 * _TWICE).float().mean())
    return (low, high) if spread >= _MIN_SPREAD else None


class PixelScaleWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = False
        self._handles: list = []
        self._reads = 0
        self._backwards = 0

    def _stop(self) -> None:
        self.active = False
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def _pre(self, module, args):
        if not self.active or not isinstance(module, _WATCHED) or not args:
            return None
        x = args[0]
        if not isinstance(x, torch.Tensor) or x.requires_grad or not torch.is_grad_enabled() \
                or not module.training or get_ident() != self.rec.script_thread:
            return None
        if isinstance(module, nn.Linear) and int(module.in_features) < _MIN_WIDTH:
            return None
        if x.device.type != "cpu" and self.rec.progress.steps:
            return None
        try:
            self._reads += 1
            if self._reads > _READS:
                self._stop()
                return None
            found = raw_pixels(x)
            if found is None:
                twice = scaled_twice(x)
                if twice is not None:
                    self._stop()
                    self.rec.emit_aside(ev.pixels_scaled_twice(
                        module=type(module).__name__, shape=[int(s) for s in x.shape],
                        low=twice[0], high=twice[1]), self.rec.here())
                return None
            low, high, over = found
            self._stop()
            self.rec.emit_aside(ev.pixels_unscaled(module=type(module).__name__,
                                                   shape=[int(s) for s in x.shape], low=low,
                                                   high=high, over=round(over, 3)),
                                self.rec.here())
        except Exception as exc:
            self._stop()
            self.rec.internal_error("pixel scale", exc)
        return None

    def describe_loss(self, tensors) -> dict:
        """``DESCRIBE_LOSS``: a script that updates by hand (no optimizer step) closes the
        window after as many backwards."""
        self._backwards += 1
        if self.active and self._backwards > WINDOW:
            self._stop()
        return {}

    def after_step(self, opt, optimizer) -> None:
        """``STEPPED``: the window closes after the first ``WINDOW`` optimizer steps; then the
        watcher leaves the topic (it never opens again)."""
        if self.active and self.rec.progress.steps >= WINDOW:
            self._stop()
        if not self.active:
            self.rec.retire(STEPPED, self.after_step)

    def _before_compile(self) -> None:
        if self.active:
            self._stop()

    def install(self, patcher) -> None:
        close_before_compile(patcher, self._before_compile)
        self._handles = register_module_hooks(patcher, self._pre)
        self.active = True
