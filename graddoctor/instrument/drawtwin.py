"""A random value the model is given directly that is a second draw, made with the same call as
the one its other input was built from: a diffusion timestep drawn again.

``t = torch.randint(0, T, (B,)); x_t = sqrt(ab[t]) * x0 + sqrt(1 - ab[t]) * noise;
t2 = torch.randint(0, T, (B,)); model(x_t, t2)``: the model is told a noise level that has
nothing to do with the noise in ``x_t``. Nothing fails; the denoiser learns an average over all
noise levels and the sampler, which trusts the timestep, produces mush.

How it is seen: inside the window (until the first ``_WINDOWS`` backwards), the
random factories (``torch.rand``, ``randn``, ``randint`` and their ``_like`` forms) are wrapped;
each result is a *draw*, with its call's arguments (the signature: function, bounds, shape,
dtype) and line. From the first draw to the next backward a ``TorchFunctionMode`` follows the
values made from each draw (the union of the draws any input came from; at most ``_OPS`` calls
a window). At each outermost module call (and each ``cat``/``stack``), an argument that is a bare draw
``D`` of one value per sample (a timestep; not random data or a latent) is judged
against the other arguments: when none of them came from ``D`` but one came from another draw
``E`` of the very same signature that the call is not given, and built an input there (more
than one value per sample, or mixed with another draw: not a random column of its own, as a
PINN's ``x = torch.rand(N, 1) * L`` beside ``t = torch.rand(N, 1)``), ``D`` took ``E``'s place (a
``draw_twin`` aside event at ``D``'s line, once per line). Two draws with the same call, each
given with its own input (two noisy views, two timesteps), a draw the input was built from
(the right code), a draw whose twin built nothing the model gets (a dropout mask's
``rand``), and a model given only a draw (a generator's latent) are all left alone.
"""

from __future__ import annotations

import sys
from threading import get_ident

import torch

from .. import events as ev
from .dependency import close_before_compile, register_module_hooks
from torch.overrides import TorchFunctionMode

from .follow import UninstallHandle, push_mode, remove_mode, script_mode_above, tensors_in, tensors_out
from .inlinable import watched_call
from .patcher import Originals
from .recorder import Recorder
from .topics import DESCRIBE_LOSS

_WINDOWS = 3  # backwards whose windows are judged (then the hooks are removed)
_OPS = 100_000  # torch calls followed per window
_DRAWS = 64  # draws noted per window
_FACTORIES = ("rand", "randn", "randint", "rand_like", "randn_like", "randint_like")
# calls whose result holds the draw's values unchanged (a view, a cast): still the bare draw
_SAME = frozenset({"__getitem__", "unsqueeze", "view", "reshape", "float", "double", "half",
                   "to", "type", "expand", "expand_as", "squeeze", "flatten", "repeat", "long",
                   "view_as", "reshape_as", "contiguous", "clone", "detach"})
# calls that put values side by side as features of one input (conditioning concatenated)
_JOIN = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "column_stack"})
_SKIP = frozenset({"size", "dim", "__get__", "shape", "numel", "is_floating_point", "__len__",
                   "__bool__", "__format__", "__repr__", "item", "tolist", "data_ptr"})


def _selects(index) -> bool:
    """An index that picks rows (a tensor or a list of positions), not one that slices or adds
    axes."""
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, (torch.Tensor, list)) for i in items)


def _signature(name: str, args, kwargs, result) -> tuple:
    """What a draw's call says about its values: the function, its numeric arguments (bounds),
    the result's shape and dtype (a tensor argument of a ``_like`` counts by its shape)."""
    numbers = tuple(a if isinstance(a, (int, float)) else tuple(a) if isinstance(a, (tuple, list))
                    else None for a in args if not isinstance(a, torch.Tensor))
    keys = tuple(sorted((k, v) for k, v in (kwargs or {}).items()
                        if isinstance(v, (int, float)) and k in ("low", "high")))
    return name, numbers, keys, tuple(result.shape), result.dtype


class _DrawMode(TorchFunctionMode):
    """Hands each call's result to ``watcher.follow`` while the window is open. A function
    graddoctor wraps reaches the mode from inside its wrapper (torch looks the public name up
    again): the original is called, so that the wrapper's watchers hear of the call once (as
    repeatedterm.py's mode does). The mode holds no state of its own (``_STATE``): Dynamo,
    tracing a function compiled before the check began, wraps the mode's attributes and cannot
    wrap bound methods; under it, the call is only made."""

    def __init__(self, watcher, originals: Originals):
        super().__init__()
        _STATE[id(self)] = (watcher, originals)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if torch.compiler.is_compiling():
            return func(*args, **(kwargs or {}))
        watcher, originals = _STATE[id(self)]
        out = originals.original_of(func)(*args, **(kwargs or {}))
        if watcher.following and getattr(func, "__name__", None) not in _SKIP:
            try:
                watcher.follow(func, args, kwargs, out)
            except Exception as exc:
                watcher.following = False
                watcher.rec.internal_error("draw_twin", exc)
        return out


_STATE: dict = {}  # id(mode) -> (watcher, originals), dropped when the mode is removed


def _built_from(tensor, came: frozenset, draw: int) -> bool:
    """Whether ``tensor``, which came from ``draw``, is an input built from it (a noised point,
    several features a sample) and not just another random column: one value per sample made
    from that draw alone (``area = torch.rand(n, 1) * 3 + 0.5`` beside ``age = torch.rand(n, 1)``
    in a synthetic table is two independent features, not a timestep drawn twice)."""
    return came != frozenset((draw,)) or not (tensor.dim() >= 1 and tensor.numel() == tensor.shape[0])


class DrawTwinWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.closed = False
        self.following = False
        self._mode = None
        self._thread = None
        self._handles: list = []
        self._patcher = None
        self._modes_below = 0  # the torch function modes entered before the run
        self._compile_callback = None  # Dynamo's compile-start callback while a window is open
        self._windows = 0
        self._reset()
        self._done: set = set()

    def _reset(self) -> None:
        self._draws: list = []  # (signature, loc, tensor)
        self._origin: dict = {}  # id(tensor) -> (tensor, frozenset of draw indices)
        self._bare: dict = {}  # id(tensor) -> (tensor, draw index): the draw's values unchanged
        self._ops = 0
        self._depth = 0

    # -- the draws ------------------------------------------------------------------------------
    def _drawn(self, name: str, args, kwargs, result) -> None:
        if self.closed or not isinstance(result, torch.Tensor) or get_ident() != self.rec.script_thread:
            return
        if len(self._draws) >= _DRAWS:
            return
        try:
            index = len(self._draws)
            self._draws.append((_signature(name, args, kwargs, result), self.rec.here(), result))
            self._origin[id(result)] = (result, frozenset((index,)))
            self._bare[id(result)] = (result, index)
            if self._mode is None:
                self._open()
        except Exception as exc:
            self.closed = True
            self.rec.internal_error(f"torch.{name}", exc)

    def _open(self) -> None:
        if script_mode_above(self._modes_below):
            return  # inside a mode the script entered: its exit would pop this one in its place
        dynamo = sys.modules.get("torch._dynamo.callback")
        if dynamo is not None and self._compile_callback is None:
            # a function compiled before the check may run under the mode, and Dynamo cannot
            # trace the window's mode: the window ends when Dynamo starts a compilation
            try:
                self._compile_callback = dynamo.callback_handler.register_start_callback(
                    lambda *args: self._stop())
            except Exception as exc:
                self.closed = True
                self.rec.internal_error("draw_twin", exc)
                return
        mode = _DrawMode(self, self._patcher.originals() if self._patcher is not None else Originals())
        thread = push_mode(mode, self.rec, "draw_twin")
        if thread is None:
            self.closed = True
            return
        self._mode, self._thread = mode, thread
        self.following = True

    def follow(self, func, args, kwargs, out) -> None:
        self._ops += 1
        if self._ops > _OPS:
            self.following = False
            return
        origin = self._origin
        found = None
        for t in tensors_in(args, kwargs):
            entry = origin.get(id(t))
            if entry is not None and entry[0] is t:
                found = entry[1] if found is None else found | entry[1]
        if found is None:
            return
        name = getattr(func, "__name__", "")
        if name in _JOIN and args and isinstance(args[0], (list, tuple)):
            self._judge(name, [t for t in args[0] if isinstance(t, torch.Tensor)])
        elif name in _SAME and len(found) == 1 and args and isinstance(args[0], torch.Tensor) \
                and not any(isinstance(a, torch.Tensor) for a in args[1:]) \
                and not any(isinstance(v, torch.Tensor) for v in (kwargs or {}).values()):
            entry = self._bare.get(id(args[0]))
            if entry is not None and entry[0] is args[0] and isinstance(out, torch.Tensor) \
                    and not (name == "__getitem__" and len(args) > 1 and _selects(args[1])):
                self._bare[id(out)] = (out, entry[1])
        for o in tensors_out(out):
            entry = origin.get(id(o))
            if entry is not None and entry[0] is o:
                origin[id(o)] = (o, entry[1] | found)
            else:
                origin[id(o)] = (o, found)

    # -- the model's calls ----------------------------------------------------------------------
    def _pre(self, module, args):
        if not self.following or get_ident() != self.rec.script_thread:
            return None
        self._depth += 1
        if self._depth == 1:
            try:
                self._judge(type(module).__name__, list(tensors_in(args, None)))
            except Exception as exc:
                self.closed = True
                self.rec.internal_error("draw_twin", exc)
        return None

    def _post(self, module, args, *rest):
        if self._depth:
            self._depth -= 1
        return None

    def _judge(self, module: str, given: list) -> None:
        """``given``: the tensors a module call (or a concatenation) puts together."""
        origin, draws, bare_of = self._origin, self._draws, self._bare
        if len(given) < 2:
            return  # a model given only a draw (a generator's latent): nothing to compare
        sources = []
        bare = {}
        for i, t in enumerate(given):
            entry = origin.get(id(t))
            came = entry[1] if entry is not None and entry[0] is t else frozenset()
            sources.append(came)
            entry = bare_of.get(id(t))
            if entry is not None and entry[0] is t and t.dim() >= 1 and t.numel() == t.shape[0] > 1:
                bare[i] = entry[1]  # one value per sample (a timestep, a time, a noise level)
        for i, d in bare.items():
            others = frozenset().union(*(s for j, s in enumerate(sources) if j != i))
            if d in others:
                continue  # the input was built from this draw: the right code
            signature = draws[d][0]
            twins = [e for e in others if e != d and draws[e][0] == signature
                     and e not in bare.values()
                     and any(e in s and _built_from(given[j], s, e)
                             for j, s in enumerate(sources) if j != i)]
            if not twins:
                continue
            loc = draws[d][1]
            if loc is None or loc in self._done:
                continue
            self._done.add(loc)
            twin = draws[twins[0]]
            self.rec.emit_aside(ev.draw_twin(
                fn=signature[0], module=module, position=i,
                twin_line=twin[1].line if twin[1] is not None else None,
                shape=list(signature[3])), loc)

    # -- the window -----------------------------------------------------------------------------
    def _close(self) -> None:
        self.following = False
        if remove_mode(self._mode, self._thread, self.rec, "draw_twin"):
            _STATE.pop(id(self._mode), None)
            self._mode = None
        self._reset()

    def describe_loss(self, tensors) -> dict:
        """Each backward closes the window; after the first ``_WINDOWS`` backwards (with draws
        before them or not) the hooks are removed."""
        if self.closed:
            return {}
        self._close()
        self._windows += 1
        if self._windows >= _WINDOWS:
            self._stop()
        return {}

    def _stop(self) -> None:
        self.closed = True
        self._close()
        callback, self._compile_callback = self._compile_callback, None
        if callback is not None:
            try:
                sys.modules["torch._dynamo.callback"].callback_handler.remove_start_callback(callback)
            except Exception:
                pass  # already gone (Dynamo's handler cleared)
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)

    def before_compile(self) -> None:
        self._stop()

    def uninstall(self) -> None:
        self._stop()

    def install(self, patcher) -> None:
        watcher = self
        self._patcher = patcher
        self._modes_below = torch._C._len_torch_function_stack()  # modes under the run (--emulate-cuda)
        for name in _FACTORIES:
            original = getattr(torch, name, None)
            if original is None:
                continue

            def after(args, kwargs, result, name=name) -> None:
                watcher._drawn(name, args, kwargs, result)

            patcher.patch(torch, name, watched_call(original, after))
        close_before_compile(patcher, self.before_compile)
        patcher.handle(UninstallHandle(self))
        self._handles = register_module_hooks(patcher, self._pre, self._post)
