"""A discriminator (critic) that compares a generator's samples with data on another range.

A GAN's generator that ends in ``tanh`` makes values in (-1, 1); real images read with
``x / 255`` (or torchvision's ``ToTensor``) lie in [0, 1]. The discriminator then tells real from
fake by the sign of the values alone, the generator must saturate half its range to reach the
data, and its gradients fade there. The same with a ``sigmoid`` generator and data scaled to
[-1, 1], or raw 0..255 pixels under any bounded output.

Fed by ``adversarial.py``'s module hooks (first ``WINDOW`` backwards): each outermost call of a
module D with parameters either on another module G's output (``generated``: the samples' range
read from G's output's autograd node, ``losses.bounded_by``: a sigmoid, tanh or softmax seen
through views; an output bounded on one side only, relu's or exp's, is left out) or on data no
module made and that needs no gradient (``plain``: the first ``_VALUES`` values of D's first floating input are kept, for the first ``_PLAIN`` such calls of
D). Once D has had both, with inputs of one shape past the batch axis, the data is judged
against the samples' range: 40 % or more of its values outside it, farther than 5 % of the
range's width past a bound (``excludes``; data in [-1, 1] with instance noise spills just past
a tanh's bounds, which the generator nearly reaches), or
every value in one half of it while the range is split by 0 and the data
spans more than a quarter of it (``half``: [0, 1] data under a tanh). A ``sample_range`` aside
event tells it once per D, at D's call on the data, with the name the calling frame binds the
data to (for the rule to follow to its scaling).

Cost: within the window, one small copy per plain call of D (at most ``_PLAIN`` per module) and
one graph lookup per call of D on another module's output.
"""

from __future__ import annotations

import sys

import torch

from .. import events as ev
from .losses import bounded_by
from .recorder import Recorder

_VALUES = 4096  # values kept per plain call
_PLAIN = 3  # plain calls kept per module
_MODULES = 16  # modules followed, at most
_OUTSIDE = 0.4  # share of data values outside the samples' range that is judged (standardised
# data has 32 % beyond +-1: a tanh generator still reaches most of it)
_SLACK = 1e-3  # a value at a bound is reachable
_NEAR = 0.05  # share of a finite range past a bound that still counts as near it: data in
# [-1, 1] with instance noise (or a jitter) added spills just past a tanh's bounds, and a
# generator reaches within a hair of every such value
_SPAN = 0.25  # share of a finite range the data must span to be judged as covering one half
_NAMES_READ = 2000


class SampleRange:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._plain: dict[int, list] = {}  # id of D -> [(values, shape past axis 0, loc, name)]
        self._generated: dict[int, tuple] = {}  # id of D -> (activation, low, high, shape, G)
        self._told: set = set()

    def plain(self, module, tensor) -> None:
        """D called on data no module made (``tensor``: its first floating input)."""
        key = id(module)
        if key in self._told or tensor.requires_grad or tensor.dim() < 2:
            return
        kept = self._plain.get(key)
        if kept is None:
            if len(self._plain) >= _MODULES:
                return
            kept = self._plain[key] = []
        if len(kept) >= _PLAIN:
            return
        values = tensor.detach().reshape(-1)[:_VALUES].to(torch.float64).cpu()
        kept.append((values, tuple(tensor.shape[1:]), self.rec.here(), self._bound_name(tensor)))
        self._judge(module)

    def generated(self, module, producer, sample) -> None:
        """D called on G's output ``sample`` (detached or not)."""
        key = id(module)
        if key in self._told or key in self._generated:
            return
        bound = bounded_by(getattr(sample, "grad_fn", None))
        if bound is None or bound[2] == float("inf") or sample.dim() < 2:
            return  # an output bounded on one side only (relu, exp): a feature map, not samples
        if len(self._generated) >= _MODULES:
            return
        self._generated[key] = (*bound, tuple(sample.shape[1:]), type(producer).__name__)
        self._judge(module)

    def _bound_name(self, tensor) -> str | None:
        """The name the user's innermost frame binds ``tensor`` to (``real``), or None."""
        for frame in self.rec.finder.user_frames(sys._getframe(1)):
            for i, (name, value) in enumerate(frame.f_locals.items()):
                if i >= _NAMES_READ:
                    break
                if value is tensor:
                    return name
            return None
        return None

    def _judge(self, module) -> None:
        key = id(module)
        generated, kept = self._generated.get(key), self._plain.get(key)
        if generated is None or not kept:
            return
        activation, low, high, shape, producer = generated
        for values, data_shape, loc, name in kept:
            if data_shape != shape or values.numel() == 0:
                continue
            how = _mismatch(values, low, high)
            if how is None:
                continue
            self._told.add(key)
            outside = float(((values < low - _SLACK) | (values > high + _SLACK)).double().mean())
            self.rec.emit_aside(ev.sample_range(
                critic=type(module).__name__, generator=producer, activation=activation,
                low=low, high=high if high != float("inf") else None,
                data_min=round(float(values.min()), 6), data_max=round(float(values.max()), 6),
                outside=round(outside, 4), how=how, name=name), loc)
            return


def _mismatch(values, low: float, high: float) -> str | None:
    """``"excludes"`` when 40 % or more of the data lies outside [low, high], ``"half"``
    when a finite range split by 0 holds the data in one of its halves only, else None."""
    near = _NEAR * (high - low) if high != float("inf") else 0.0
    beyond = max(_SLACK, near)
    outside = float(((values < low - beyond) | (values > high + beyond)).double().mean())
    if outside >= _OUTSIDE:
        return "excludes"
    if high == float("inf") or not low < 0.0 < high:
        return None
    lo, hi = float(values.min()), float(values.max())
    if hi - lo < _SPAN * (high - low):
        return None  # too narrow a batch to say which part of the range the data uses
    if lo >= -_SLACK or hi <= _SLACK:
        return "half"
    return None
