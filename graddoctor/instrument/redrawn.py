"""A regression target that is a fresh standard-normal draw taken after the model's forward:
the noise a diffusion (or denoising score-matching) loss should predict, drawn a second time.

``x_t = sqrt(ab) * x0 + sqrt(1 - ab) * noise; loss = F.mse_loss(model(x_t, t),
torch.randn_like(x0))``: the target is new noise, not the ``noise`` mixed into ``x_t``. Nothing in
the model's input tells anything about it, so the best the model can do is predict 0; the loss
sits at about 1 and the sampler built on the model produces noise. Nothing fails.

How it is seen: while the window is open (the losses of the first ``_WINDOWS`` backwards), a
global module forward hook keeps the CPU generator's state at the end of each module call (the
last one is the end of the model's forward). The regression losses (``mse_loss``, ``l1_loss``,
``smooth_l1_loss``, ``huber_loss``; their ``nn`` modules call them) are patched: a target that
is a floating CPU tensor with no gradient, compared with an input that has a graph, is checked
against the standard-normal numbers a private generator set to that state draws first (same
shape and dtype). Equal to the last bit: the target is the first random draw made after the
forward, which the model cannot have seen. The target must also have the shape of one of the
tensors that last module call was given (the noisy input ``x_t``; for images, channels apart:
conditioning channels concatenated to it): a synthetic regression
target drawn after the forward (``F.mse_loss(mlp(x), torch.randn(32, 1))`` in a benchmark
script) is not noise the model was meant to recover. A ``noise_redrawn`` aside event names the
call line, once per line.

The noise drawn before the forward (the right code) is not the next draw after it; a target
made from a draw (``0.1 * torch.randn_like(y) + y``) is not a draw; noise drawn on a GPU is not
looked at. Cost: one ``torch.get_rng_state()`` per module call and one draw of the target's size
per regression-loss call, inside the window only; then the hooks are removed.
"""

from __future__ import annotations

from threading import get_ident

import torch
import torch.nn.functional as F

from .. import events as ev
from .dependency import close_before_compile, register_module_hooks
from .graphpaths import reached
from .inlinable import unwatch, watched
from .recorder import Recorder

NAMES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
_WINDOWS = 3  # backwards whose losses are looked at
_MIN, _MAX = 8, 1 << 24  # target sizes checked (fewer numbers could match by chance: never)
_NODES = 20000  # nodes walked to the input's parameters, once per finding


def _input_shaped(shape: tuple, inputs: set) -> bool:
    """The target has the shape of one of the model's inputs, or for images and volumes (4 dims
    or more) the same shape but for the channels: conditioning channels concatenated to the
    noisy input (a time map, SR3's low-resolution image, an inpainting mask)."""
    if shape in inputs:
        return True
    return len(shape) >= 4 and any(len(other) == len(shape) and other[0] == shape[0]
                                   and other[2:] == shape[2:] for other in inputs)


class RedrawnNoiseWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = False
        self._handles: list = []
        self._state = None  # the CPU generator's state at the end of the last module call
        self._shapes: set = set()  # the shapes of that call's tensor arguments
        self._arity = 0  # how many tensor arguments that call had
        self._backwards = 0
        self._done: set = set()
        self._befores: list = []  # (name, this watcher's before in F.<name>'s wrapper)

    # -- module hooks (only while the window is open) ---------------------------------------
    def _pre(self, module, args):
        return None

    def _post(self, module, args, *rest):
        if not self.active or get_ident() != self.rec.script_thread:
            return None
        try:
            self._state = torch.get_rng_state()
            kwargs = rest[0] if len(rest) == 2 and isinstance(rest[0], dict) else {}
            tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
            self._shapes = {tuple(t.shape) for t in tensors}
            self._arity = len(tensors)
        except Exception as exc:
            self._stop()
            self.rec.internal_error("noise_redrawn (forward end)", exc)
        return None

    def _stop(self) -> None:
        self.active = False
        self._state = None
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        befores, self._befores = self._befores, []
        for name, before in befores:  # out of the loss wrappers it shares (a call per loss call)
            try:
                unwatch(F, name, before)
            except Exception as exc:
                self.rec.internal_error("noise_redrawn (unwatch)", exc)

    # -- the losses ---------------------------------------------------------------------------
    def _wrap(self, original, fn: str):
        watcher = self

        def before(args, kwargs) -> None:
            if watcher._state is None:
                return
            target = args[1] if len(args) > 1 else kwargs.get("target")
            if not (isinstance(target, torch.Tensor) and not target.requires_grad
                    and target.is_floating_point() and target.device.type == "cpu"
                    and _MIN <= target.numel() <= _MAX):
                return
            input = args[0] if args else kwargs.get("input")
            if not (isinstance(input, torch.Tensor) and input.grad_fn is not None):
                return
            try:
                watcher._check(fn, input, target)
            except Exception as exc:
                watcher.rec.internal_error(f"F.{fn}", exc)

        self._befores.append((fn, before))  # for _stop's unwatch
        return watched(original, before)

    def _check(self, fn: str, input, target) -> None:
        if get_ident() != self.rec.script_thread:
            return
        shape = tuple(target.shape)
        if not _input_shaped(shape, self._shapes):
            return  # noise of the model input's shape only (not a synthetic regression target)
        if shape in self._shapes and self._arity < 2:
            # a model of one input of the target's very shape and nothing to tell it the noise
            # level (no timestep, no concatenated conditioning): a synthetic regression towards
            # random targets (`mse(model(x), torch.randn(16, 8))`), not a noise predictor
            return
        generator = torch.Generator()
        generator.set_state(self._state)
        drawn = torch.randn(target.shape, generator=generator, dtype=target.dtype)
        if not torch.equal(drawn, target):
            return
        loc = self.rec.here()
        if loc in self._done:
            return
        self._done.add(loc)
        tensors = self.rec.tensors
        walked = reached(input.grad_fn, _NODES, truncate=True)
        pids = sorted(pid for i in walked[1]
                      if (pid := tensors.number.get(i)) is not None and id(tensors.refs[pid]()) == i)
        self.rec.emit_aside(ev.noise_redrawn(fn=fn, params=pids[:64], numel=int(target.numel())), loc)

    def describe_loss(self, tensors) -> dict:
        """At each backward: the window closes after the losses of the first ``_WINDOWS``."""
        if not self.active:
            return {}
        self._state = None  # a forward since this backward must come first
        self._backwards += 1
        if self._backwards >= _WINDOWS:
            self._stop()
        return {}

    # -- install -----------------------------------------------------------------------------
    def install(self, patcher) -> None:
        for name in NAMES:
            original = getattr(F, name, None)
            if original is not None:
                patcher.patch(F, name, self._wrap(original, name))
        close_before_compile(patcher, self._stop)
        self._handles = register_module_hooks(patcher, None, self._post)
        self.active = True
