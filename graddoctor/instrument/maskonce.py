"""A 0/1 mask applied to a weight once, before training, and never again (mask-applied-once).

Masked layers keep some connections at zero on purpose: PixelCNN's and MADE's autoregressive
masks (a position must not see itself or what follows), a causal convolution's masked taps,
fixed block-sparse connectivity, a pruned weight. Multiplying the weight by its mask once, in
``__init__`` or before the loop (``self.weight.data *= self.mask``), makes the first forward
right; but the masked entries still get a gradient (the forward uses the weight as it is), so
the first optimizer step moves them off zero and the masked connections are live from then on:
the autoregressive model sees the values it predicts, the pruned weights grow back. Nothing
fails and the loss even drops faster.

Read from a global forward hook (removed after ``_WINDOW_STEPS`` optimizer steps, or once
nothing is left to check) on modules run with gradients on, on the script's thread, CPU tensors
only:

* the first time a module is seen, each of its own floating parameters that needs a gradient is
  paired with each 0/1 tensor the module holds (a buffer or a plain tensor attribute; bool or
  only 0s and 1s, some of each) whose shape broadcasts to the parameter's: a *candidate* when
  the parameter is exactly zero wherever the mask is 0 and mostly nonzero, with more than one
  value, where it is 1 (a trained or random weight the mask was applied to, not an identity
  or constant initialisation that has the mask's own pattern); its version is noted;
* at a later forward of that module, once the parameter's version has moved (an update, or the
  script's own in-place write), its entries where the mask is 0 are read after the forward ran
  (so a forward, or a forward pre-hook, that re-applies the mask is seen as having done so):
  any nonzero there is a ``mask_regrown`` aside, once per parameter; all zero at
  ``_CHECKS`` such forwards and the candidate is dropped (the mask is kept up).

At the same first forward, a 4-D parameter (a 2-D convolution's weight) with such a mask is
checked for a causal pattern that leaks: the mask hides kernel positions after the centre (in
raster order) and none before it, yet keeps part of a row below the centre, or keeps rows below
while the rest of the centre row is hidden: a ``mask_not_causal`` aside, once per module
(autoregressive-mask-leaks). A vertical stack's mask (whole rows below hidden) is no leak.

At the first forward of a module whose 2-D parameter (a linear layer's weight) has a 0/1 mask of
its own shape, the layer is chained to the masked layer whose output its input is, through
pointwise activations only (MADE's masked linear layers with a ReLU between): at the first
optimizer step, each chain of two such layers or more, read from the inputs to its last
layer's outputs, gives which input each output depends on. When the outputs are k blocks of
the inputs' size (MADE's ``mu, alpha = out.chunk(2, 1)``, or ``view(d, k)`` interleaved) and,
in one layout, the dependencies between different positions form an order (no cycle, some
edge) while some output depends on its own position, with no layout that depends on no
position of its own: a ``mask_sees_itself`` aside (autoregressive-mask-leaks). A correct
MADE (output degrees compared strictly), random pruning masks (their products connect
everything) and block-diagonal masks (cycles in a block) are no such leak.

A mask used in the forward (``F.linear(x, self.weight * self.mask)``) gives the masked entries a
zero gradient, so a weight masked at initialisation stays zero there: silent. So are masks
re-applied after each step, ``torch.nn.utils.prune`` (``weight_orig`` is not zeroed), masks
that are not the module's own (a dict of masks in the script: not seen), and a weight whose
zeros have no mask beside them (an identity or zero-channel initialisation that is meant to
train).
"""

from __future__ import annotations

import inspect
import weakref
from threading import get_ident

import torch

from .. import events as ev
from .dependency import close_before_compile, register_module_hooks
from .recorder import Recorder
from .topics import STEPPED

_WINDOW_STEPS = 6  # optimizer steps after which the global hook is removed
_ref = weakref.ref
_CHECKS = 3  # forwards after an update that find the masked entries still zero: mask kept up
_MODULES = 4096  # modules looked at, at most
_MIN_MASKED = 2  # masked entries a candidate needs
_KEPT = 0.5  # a candidate's weight is nonzero on at least this share of its unmasked entries
_CHAIN_HOPS = 4  # pointwise nodes between two chained masked layers, at most
_CHAIN_DIM = 1024  # inputs of a chain whose dependencies are read, at most
# autograd nodes of elementwise activations (and their no-op neighbours) between chained layers
_POINTWISE = frozenset({
    "ReluBackward0", "TanhBackward0", "SigmoidBackward0", "EluBackward0", "LeakyReluBackward0",
    "GeluBackward0", "SiluBackward0", "SoftplusBackward0", "HardtanhBackward0", "MishBackward0",
    "CloneBackward0", "NativeDropoutBackward0", "PreluKernelBackward0", "HardswishBackward0",
})


def _mask_of(value) -> torch.Tensor | None:
    """``value`` as a bool tensor of its zeros when it is a 0/1 tensor with some of each."""
    if not isinstance(value, torch.Tensor) or isinstance(value, torch.nn.Parameter) \
            or value.device.type != "cpu" or value.numel() < 2 or value.is_sparse:
        return None
    with torch.no_grad():
        if value.dtype == torch.bool:
            zeros = ~value
        else:
            if value.is_complex() or not bool(((value == 0) | (value == 1)).all()):
                return None
            zeros = value == 0
        count = int(zeros.sum())
    if count == 0 or count == value.numel():
        return None
    return zeros


def _tensors(module) -> list[tuple[str, torch.Tensor]]:
    """The module's own buffers and plain tensor attributes."""
    found = [(name, t) for name, t in module._buffers.items() if t is not None]
    found += [(name, t) for name, t in vars(module).items()
              if type(t) is torch.Tensor and not name.startswith("__")]
    return found


def _class_span(cls) -> tuple[str, int, int] | None:
    """(file, first line, last line) of a class the script defines, else None."""
    try:
        lines, first = inspect.getsourcelines(cls)
        return inspect.getsourcefile(cls) or "", first, first + len(lines) - 1
    except (OSError, TypeError):
        return None


class MaskOnceWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = False
        self._handles: list = []
        self._steps = 0
        self._seen: weakref.WeakSet = weakref.WeakSet()
        # module -> [[param name, mask name, zeros, param version, checks], ...]
        self._candidates: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # id(output's grad_fn) -> (that node, the chain of masked layers ending there: [(keep, module)])
        self._outputs: dict = {}
        self._extended: set = set()  # ids of the nodes whose chain a later layer extended
        self._chain_loc = {}  # id(output's grad_fn) -> the script's line of that layer's forward
        rec.subscribe(STEPPED, self.after_step)

    def _stop(self) -> None:
        if self.active:
            self.rec.retire(STEPPED, self.after_step)
        self.active = False
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._candidates = weakref.WeakKeyDictionary()

    def after_step(self, opt: int, optimizer) -> None:
        self._steps += 1
        if self._outputs:
            outputs, self._outputs = self._outputs, {}
            extended, self._extended = self._extended, set()
            where, self._chain_loc = self._chain_loc, {}
            try:
                told = set()
                for key, (_node, chain) in outputs.items():
                    if key in extended or len(chain) < 2:
                        continue
                    cls = type(chain[-1][1]).__name__
                    if cls not in told and self._sees_itself(chain, where.get(key)):
                        told.add(cls)
            except Exception as exc:
                self.rec.internal_error("masks applied once", exc)
        if self._steps >= _WINDOW_STEPS:
            self._stop()

    def _post(self, module, args, output):
        # a module seen already while no candidate is left: what the rest returns, tested on the
        # weak containers' own dicts (no Python frame of ``weakref``'s per module call; every
        # module of the model passes here at every forward of the window)
        try:
            if not self._candidates.data and _ref(module) in self._seen.data:
                return None
        except TypeError:  # no weak reference to it: as ``WeakSet`` answers, not seen
            pass
        if not self.active or get_ident() != self.rec.script_thread or not torch.is_grad_enabled():
            return None
        try:
            pending = self._candidates.get(module)
            if pending is not None:
                self._check(module, pending)
            elif module not in self._seen:
                if len(self._seen) >= _MODULES:
                    return None
                self._seen.add(module)
                self._note(module, args, output)
        except Exception as exc:
            self._stop()
            self.rec.internal_error("masks applied once", exc)
        return None

    def _note(self, module, args=(), output=None) -> None:
        params = [(name, p) for name, p in module._parameters.items()
                  if p is not None and p.requires_grad and p.is_floating_point()
                  and p.device.type == "cpu" and p.dim() >= 1]
        if not params:
            return
        masks = [(name, zeros) for name, t in _tensors(module) if (zeros := _mask_of(t)) is not None]
        if not masks:
            return
        self._causal(module, params, masks)
        self._chain(module, params, masks, args, output)
        found = []
        with torch.no_grad():
            for pname, param in params:
                for mname, zeros in masks:
                    try:
                        if torch.broadcast_shapes(zeros.shape, param.shape) != param.shape:
                            continue
                    except RuntimeError:
                        continue
                    where = zeros.expand(param.shape)
                    masked = int(where.sum())
                    if masked < _MIN_MASKED or bool(param[where].any()):
                        continue
                    kept = param[~where]
                    if kept.numel() < 2 or int((kept != 0).sum()) < _KEPT * kept.numel() \
                            or not bool((kept != kept[0]).any()):
                        continue  # one value where the mask is 1: an identity or constant init
                    found.append([pname, mname, where.clone(), param._version, 0])
                    break
        if found:
            self._candidates[module] = found

    def _causal(self, module, params, masks) -> None:
        """A 2-D convolution's mask meant to be causal (it hides positions after the kernel's
        centre in raster order and keeps every position before it) that keeps some positions
        after the centre all the same: part of a row below the centre, or rows below while the
        centre row's right part is hidden. A vertical stack's mask (whole rows below hidden, the
        centre row kept) is no such leak."""
        for pname, param in params:
            if param.dim() != 4 or param.shape[2] < 2 or param.shape[3] < 2:
                continue
            for mname, zeros in masks:
                try:
                    if torch.broadcast_shapes(zeros.shape, param.shape) != param.shape:
                        continue
                except RuntimeError:
                    continue
                with torch.no_grad():
                    hidden = zeros.expand(param.shape).flatten(0, 1).all(0)  # (kh, kw)
                kh, kw = hidden.shape
                ch, cw = kh // 2, kw // 2
                if bool(hidden[:ch].any()) or bool(hidden[ch, :cw].any()):
                    continue  # the past is not all kept: no causal mask (a checkerboard, a pattern)
                below = hidden[ch + 1:]
                partial_rows = bool((below.any(1) & ~below.all(1)).any())
                right_hidden = cw + 1 < kw and bool(hidden[ch, cw + 1:].all())
                rows_open = bool((~below).any())
                if not (partial_rows or (right_hidden and rows_open)):
                    continue
                open_after = [[int(r) + ch + 1, int(c)] for r, c in (~below).nonzero().tolist()][:8]
                self._tell_leak(module, pname, mname, [int(kh), int(kw)], open_after)
                return

    def _chain(self, module, params, masks, args, output) -> None:
        """Chain a masked linear layer (a 2-D parameter with a 0/1 mask of its shape) to the
        masked layer whose output its input is, through pointwise activations only."""
        if self._steps or not isinstance(output, torch.Tensor) or output.grad_fn is None:
            return
        keep = next((~zeros for _pname, param in params if param.dim() == 2
                     for _mname, zeros in masks if zeros.shape == param.shape), None)
        if keep is None:
            return
        chain = []
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        node = x.grad_fn if x is not None else None
        for _ in range(_CHAIN_HOPS + 1):
            if node is None:
                break
            found = self._outputs.get(id(node))
            if found is not None and found[0] is node:
                if found[1][-1][0].shape[0] == keep.shape[1]:
                    chain = found[1]
                    self._extended.add(id(node))
                break
            if type(node).__name__ not in _POINTWISE or not node.next_functions:
                break
            node = node.next_functions[0][0]
        key = id(output.grad_fn)
        self._outputs[key] = (output.grad_fn, chain + [(keep, module)])
        self._chain_loc[key] = self.rec.here()

    def _sees_itself(self, chain, loc) -> bool:
        """Emit ``mask_sees_itself`` when the chain's outputs, read as k blocks of its inputs,
        depend on the positions before them in some order and some on their own position."""
        with torch.no_grad():
            reach = chain[0][0].float()
            for keep, _module in chain[1:]:
                reach = (keep.float() @ reach).clamp_(max=1.0)
        out, d = reach.shape
        if d < 2 or d > _CHAIN_DIM or out % d:
            return False
        k = out // d
        reach = reach > 0
        layouts = [reach.view(k, d, d).any(0), reach.view(d, k, d).any(1)]
        leaking = None
        for seen in layouts:
            own = seen.diagonal()
            between = seen & ~torch.eye(d, dtype=torch.bool)
            if not bool(between.any()) or not _ordered(between):
                continue
            if not bool(own.any()):
                return False  # an autoregressive layout: each output depends only on earlier positions
            if leaking is None:
                leaking = int(own.sum())
        if leaking is None:
            return False
        last = chain[-1][1]
        rec = self.rec
        span = _class_span(type(last))
        defined_at = None
        if span is not None and span[0] and rec.finder.is_user_file(span[0]):
            defined_at = [rec.finder.display_path(span[0]), span[1], span[2]]
        rec.emit_aside(ev.mask_sees_itself(cls=type(last).__name__, layers=len(chain), inputs=d,
                                           blocks=k, seen=leaking, defined_at=defined_at), loc or rec.here())
        return True

    def _tell_leak(self, module, pname: str, mname: str, kernel: list, open_after: list) -> None:
        rec = self.rec
        span = _class_span(type(module))
        defined_at = None
        if span is not None and span[0] and rec.finder.is_user_file(span[0]):
            defined_at = [rec.finder.display_path(span[0]), span[1], span[2]]
        rec.emit_aside(ev.mask_not_causal(cls=type(module).__name__, param=pname, mask=mname,
                                          kernel=kernel, open_after=open_after,
                                          defined_at=defined_at), rec.here())

    def _check(self, module, pending: list) -> None:
        for entry in list(pending):
            pname, mname, where, version, checks = entry
            param = module._parameters.get(pname)
            if param is None or param.shape != where.shape:
                pending.remove(entry)
                continue
            if param._version == version:
                continue
            entry[3] = param._version
            with torch.no_grad():
                regrown = int((param[where] != 0).sum())
            if regrown:
                pending.remove(entry)
                self._tell(module, pname, mname, regrown, int(where.sum()))
            else:
                entry[4] = checks + 1
                if entry[4] >= _CHECKS:
                    pending.remove(entry)
        if not pending:
            del self._candidates[module]

    def _tell(self, module, pname: str, mname: str, regrown: int, masked: int) -> None:
        rec = self.rec
        span = _class_span(type(module))
        defined_at = None
        if span is not None and span[0] and rec.finder.is_user_file(span[0]):
            defined_at = [rec.finder.display_path(span[0]), span[1], span[2]]
        param = module._parameters.get(pname)
        pid = rec.tensors.number.get(id(param)) if param is not None else None
        if pid is not None and rec.tensor(pid) is not param:
            pid = None
        rec.emit_aside(ev.mask_regrown(cls=type(module).__name__, param=pname, mask=mname,
                                       regrown=regrown, masked=masked, steps=self._steps,
                                       defined_at=defined_at, pid=pid), rec.here())

    def _before_compile(self) -> None:
        if self.active:
            self._stop()

    def install(self, patcher) -> None:
        close_before_compile(patcher, self._before_compile)
        self.active = True
        self._handles = register_module_hooks(patcher, None, self._post, with_kwargs=False,
                                              always_call=False)


def _ordered(between: torch.Tensor) -> bool:
    """Whether the dependencies ``between[i, j]`` (output i reads input j, i != j) hold no cycle:
    the positions can be put in an order where each reads only earlier ones."""
    alive = torch.ones(between.shape[0], dtype=torch.bool)
    while bool(alive.any()):
        free = alive & ~(between[:, alive].any(1))
        if not bool(free.any()):
            return False
        alive &= ~free
    return True
