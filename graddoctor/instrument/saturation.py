"""tanh and sigmoid layers saturated from the start: most of their inputs so large that the
gradient through them is about 0, so the layers before them barely train.

``tanh'(x) < 1 %`` of its largest value once ``|x| > 3``; sigmoid is a tanh at half the scale
(``sigmoid(x) = (1 + tanh(x / 2)) / 2``), so the same holds past ``|x| > 6``. A layer whose
outputs are mostly beyond that at the first steps was initialised too wide for its input
(``nn.init.normal_(w, std=1.0)`` over 256 inputs gives outputs of std 16) or given unscaled
inputs (incomes, raw counts); either way the run learns little through it and the loss stalls.

What is watched, and its cost:

* ``torch.nn.init``'s in-place initialisers (wrapped for the whole run; recorded only before
  the first optimizer step, in the script's thread): each tensor of two dimensions or more
  they set, with its version after the call and the user's line: the ``nn.init`` call when the
  script's own code made it, else the line that built the layer (torch's
  ``reset_parameters``). One location lookup per initialiser call at model construction.
* a global forward hook, for the first ``WINDOW`` optimizer steps (or backwards), remembers the
  latest outputs of training-mode layers whose ``weight`` was initialised in this run (at most
  ``_OUTPUTS`` of them), and whether the layer's input had a graph;
* ``torch.tanh``, ``torch.sigmoid``, ``Tensor.tanh`` and ``Tensor.sigmoid`` (``nn.Tanh``,
  ``nn.Sigmoid``, ``F.tanh`` and ``F.sigmoid`` call these) are wrapped; in the window, a call
  with a gradient whose input *is* such a layer's output (CPU) measures the share of inputs
  beyond the threshold: one comparison and one mean per call, at most ``CALLS`` calls per
  layer. After the window the wrappers cost one flag test.

A layer is judged only when its weight was as its initialisation left it at its first call
watched (same version): a loaded checkpoint (``load_state_dict`` copies into the weight) or
weights set by hand may be saturated on purpose (a gate that learned to stay open). A sigmoid
whose output a ``binary_cross_entropy`` takes (``F.binary_cross_entropy`` is wrapped in the
window too) is not reported: the loss's log cancels the sigmoid's flat tails, the gradient to
the logits is ``p - y``. When the window closes (or the run ends first), each judged layer whose
first ``CALLS`` calls were all saturated on most inputs gets one ``activation_saturated``
aside, at the initialisation's location.
"""

from __future__ import annotations

import functools
import sys
import weakref
from threading import get_ident

import torch

from .. import events as ev
from .dependency import close_before_compile, register_module_hooks
from .names import user_variables
from .recorder import Recorder
from .resets import INITIALISERS
from .topics import DESCRIBE_LOSS, STEPPED

WINDOW = 3  # optimizer steps (or backwards) watched, from the first one
CALLS = 3  # calls of an activation on one layer's output judged
SATURATED = 0.5  # share of the inputs beyond the threshold: most
THRESHOLDS = {"tanh": 3.0, "sigmoid": 6.0}  # |x| where the derivative is 1 % of its largest
_OUTPUTS = 256  # layer outputs remembered at once
_INITS = 100_000  # initialised tensors remembered (model construction)
_PACKAGE_DIR = __file__.rsplit("/", 2)[0]  # graddoctor/: its own frames are skipped


class SaturationWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = False
        self._handles: list = []
        self._backwards = 0
        # id(tensor) -> (weakref to it, its version after the initialiser, location, by hand)
        self._inits: dict[int, tuple] = {}
        # id(output) -> (weakref to it, weakref to the layer, the layer's input had a graph)
        self._outputs: dict[int, tuple] = {}
        # id(layer) -> its entry (see _post) while judged; None: not judged
        self._layers: dict[int, list | None] = {}
        # id(a watched sigmoid's output) -> (weakref to it, its layer's entry)
        self._probabilities: dict[int, tuple] = {}

    # -- initialisers ----------------------------------------------------------------------
    def _by_hand(self) -> bool:
        """Whether the initialiser was called by the script's own code (not by torch's
        ``reset_parameters`` while a layer is built)."""
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            frame = frame.f_back
        return frame is not None and self.rec.finder.is_user_file(frame.f_code.co_filename)

    def _wrap_init(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def initialiser(tensor, *args, **kwargs):
            result = original(tensor, *args, **kwargs)
            if rec.progress.steps or get_ident() != rec.script_thread:
                return result
            try:
                if type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.dim() >= 2 \
                        and len(watcher._inits) < _INITS:
                    watcher._inits[id(tensor)] = (weakref.ref(tensor), tensor._version,
                                                  rec.here(2), watcher._by_hand())
            except Exception as exc:
                rec.internal_error("activation saturation (init)", exc)
            return result

        return initialiser

    # -- the window ------------------------------------------------------------------------
    def _stop(self) -> None:
        if not self.active:
            return
        self.active = False
        self.rec.retire(STEPPED, self.after_step)  # nothing more to read: no call per step
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._outputs.clear()
        self._probabilities.clear()
        self._inits.clear()
        try:
            for layer in self._layers.values():
                if layer is None or len(layer[2]) < CALLS or min(layer[2]) < SATURATED \
                        or layer[5]:
                    continue
                module = layer[0]()
                init = layer[3]
                self.rec.emit_aside(ev.activation_saturated(
                    fn=layer[1], module=type(module).__name__ if module is not None else "?",
                    layer=self._name(module), threshold=THRESHOLDS[layer[1]], shares=list(layer[2]),
                    init=bool(init[3]), data_input=layer[4]), init[2])
        except Exception as exc:
            self.rec.internal_error("activation saturation", exc)
        self._layers.clear()

    def _name(self, module) -> str | None:
        """The layer's name after the user's variables (``model.fc1``), or None."""
        if module is None:
            return None
        for name, value in user_variables(self.rec).items():
            if isinstance(value, torch.nn.Module):
                for path, sub in value.named_modules():
                    if sub is module:
                        return f"{name}.{path}" if path else name
        return None

    def close(self) -> None:
        """At the end of the run: a window still open (a run shorter than it) is judged."""
        self._stop()

    def describe_loss(self, tensors) -> dict:
        """``DESCRIBE_LOSS``: a script that updates by hand closes the window after as many
        backwards."""
        self._backwards += 1
        if self.active and self._backwards > WINDOW:
            self._stop()
        return {}

    def after_step(self, opt, optimizer) -> None:
        """``STEPPED``: the window closes after the first ``WINDOW`` optimizer steps."""
        if self.active and self.rec.progress.steps >= WINDOW:
            self._stop()

    def _post(self, module, args, *rest):
        if not self.active or not module.training or not torch.is_grad_enabled():
            return None
        output = rest[-1]
        weight = getattr(module, "weight", None)
        if type(output) is not torch.Tensor or not isinstance(weight, torch.nn.Parameter) \
                or not weight.requires_grad or output.device.type != "cpu":
            return None
        try:
            key = id(module)
            layer = self._layers.get(key, False)
            if layer is False or (layer is not None and layer[0]() is not module):
                init = self._inits.get(id(weight))
                fresh = init is not None and init[0]() is weight and init[1] == weight._version
                # [the layer, fn, shares, its init, data input, its sigmoid fed a binary
                # cross-entropy]
                self._layers[key] = [weakref.ref(module), None, [], init, False, False] \
                    if fresh else None
            if self._layers[key] is None or get_ident() != self.rec.script_thread:
                return None
            if len(self._outputs) >= _OUTPUTS:
                self._outputs.clear()
            x = args[0] if args else None
            graph = isinstance(x, torch.Tensor) and x.requires_grad
            self._outputs[id(output)] = (weakref.ref(output), weakref.ref(module), graph)
        except Exception as exc:
            self._stop()
            self.rec.internal_error("activation saturation", exc)
        return None

    def _activation(self, fn: str, x) -> list | None:
        """The judged layer whose output ``x`` is, after measuring this call; else None."""
        entry = self._outputs.get(id(x))
        if entry is None or entry[0]() is not x or not x.requires_grad \
                or not torch.is_grad_enabled() or get_ident() != self.rec.script_thread:
            return None
        module = entry[1]()
        layer = self._layers.get(id(module)) if module is not None else None
        if layer is None or layer[0]() is not module or len(layer[2]) >= CALLS:
            return None
        if layer[1] is None:
            layer[1] = fn
        elif layer[1] != fn:
            return None
        with torch.no_grad():
            share = float((x.detach().abs() > THRESHOLDS[fn]).float().mean())
        layer[2].append(round(share, 4))
        layer[4] = layer[4] or not entry[2]
        return layer

    def _cross_entropy(self, p) -> None:
        """A binary cross-entropy given a watched sigmoid's output: its log cancels the
        sigmoid's flat tails (the gradient to the logits is p - y), so saturation starves
        nothing there."""
        entry = self._probabilities.get(id(p))
        if entry is not None and entry[0]() is p:
            entry[1][5] = True

    def _wrap_activation(self, original, fn: str):
        watcher = self

        @functools.wraps(original)
        def activation(x, *args, **kwargs):
            layer = None
            if watcher.active and type(x) is torch.Tensor and x.is_floating_point():
                try:
                    layer = watcher._activation(fn, x)
                except Exception as exc:
                    watcher.rec.internal_error("activation saturation", exc)
                    watcher._stop()
            out = original(x, *args, **kwargs)
            if layer is not None and fn == "sigmoid" and type(out) is torch.Tensor:
                if len(watcher._probabilities) >= _OUTPUTS:
                    watcher._probabilities.clear()
                watcher._probabilities[id(out)] = (weakref.ref(out), layer)
            return out

        return activation

    def _wrap_bce(self, original):
        watcher = self

        @functools.wraps(original)
        def binary_cross_entropy(input, *args, **kwargs):
            if watcher.active and type(input) is torch.Tensor:
                try:
                    watcher._cross_entropy(input)
                except Exception as exc:
                    watcher.rec.internal_error("activation saturation", exc)
                    watcher._stop()
            return original(input, *args, **kwargs)

        return binary_cross_entropy

    def _before_compile(self) -> None:
        if self.active:
            self._stop()

    def install(self, patcher) -> None:
        init = torch.nn.init
        for name in INITIALISERS:
            original = getattr(init, name, None)
            if callable(original):
                patcher.patch(init, name, self._wrap_init(original))
        for owner in (torch, torch.Tensor):
            for fn in THRESHOLDS:
                patcher.patch(owner, fn, self._wrap_activation(getattr(owner, fn), fn))
        functional = torch.nn.functional
        patcher.patch(functional, "binary_cross_entropy",
                      self._wrap_bce(functional.binary_cross_entropy))
        close_before_compile(patcher, self._before_compile)
        self._handles = register_module_hooks(patcher, post=self._post)
        self.active = True
